"""The main job (`specctl demo`) and `specctl bench` run end to end on the bundled demo pair."""

import json
import subprocess
import sys
from pathlib import Path

from specctl.demo_pair import demo_pair_dirs


def specctl(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specctl.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_demo_shows_acceptance_and_speed() -> None:
    proc = specctl("demo", "--num-prompts", "1", "--max-tokens", "12")
    assert proc.returncode == 0, proc.stderr
    assert "acceptance rate" in proc.stdout
    assert "tokens/s" in proc.stdout
    assert "greedy outputs identical to target-only decoding: True" in proc.stdout


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
