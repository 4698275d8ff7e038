"""The main job (`specctl demo`) and `specctl bench` run end to end on the bundled demo pair."""

import json
import subprocess
import sys
from pathlib import Path

from specctl.demo_pair import demo_pair_dirs
from tests.control.deployment_cli import APPLY_TIMEOUT_S, Cli, free_port, local_cluster_file
from tests.control.test_apply_e2e import DRAFTER_NODE


def specctl(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specctl.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_demo_applies_serves_and_leaves_the_deployment_up(tmp_path: Path) -> None:
    """The main job on the real path: apply, requests through the endpoint, figures from its
    /metrics; the deployment answers afterwards, and `specctl down` leaves no process."""
    cli = Cli(tmp_path / "home")
    config = local_cluster_file(tmp_path / "cluster.toml", free_port(), drafter_node=DRAFTER_NODE)
    try:
        demo = cli.run(
            "demo", "--config", str(config), "--num-prompts", "3", "--max-tokens", "12",
            timeout_s=APPLY_TIMEOUT_S,
        )  # fmt: skip
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert "acceptance rate" in demo.stdout and "tokens/s" in demo.stdout
        assert "specctl down" in demo.stdout
        status = cli.status()
        assert status["server_status"] == "ready"
        again = cli.run(
            "demo", "--config", str(config), "--num-prompts", "2", "--max-tokens", "8", "--json",
            timeout_s=APPLY_TIMEOUT_S,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        figures = json.loads(again.stdout)  # stdout holds the figures alone
        assert figures["num_generated_tokens"] == 16
        assert figures["acceptance_rate"] is not None and 0 <= figures["acceptance_rate"] <= 1
        assert "changed: nothing" in again.stderr  # the second apply found it up
    finally:
        down = cli.run("down", timeout_s=180)
    assert down.returncode == 0, down.stderr
    assert cli.processes() == []


def test_bench_writes_report(tmp_path: Path) -> None:
    target, draft = demo_pair_dirs()
    proc = specctl(
        "bench", "--target", target, "--draft", draft, "--no-peers", "--concurrency", "1,2",
        "--num-prompts", "2", "--max-tokens", "6", "--out", tmp_path, "--threads", "1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "bench.json").read_text())
    modes = {(r["mode"], r["concurrency"]) for r in report["rows"]}
    assert ("target-only", 1) in modes and ("spec adaptive", 2) in modes
    assert report["lossless"] is True
    assert report["bound"]["speedup_bound"] > 0
    assert "analytic bound" in proc.stdout


def test_bench_rejects_bad_concurrency(tmp_path: Path) -> None:
    proc = specctl("bench", "--concurrency", "1,x", "--out", tmp_path, "--no-peers")
    assert proc.returncode == 2
    assert "--concurrency" in proc.stderr
    assert "Traceback" not in proc.stderr
