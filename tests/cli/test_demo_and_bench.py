"""The main job (`specctl demo`) and `specctl bench` run end to end on the bundled demo pair."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
        "--repeats", "2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["machine"]["cores"] >= 1 and data["machine"]["torch_threads"] == 1
    paths = data["machine"]["skinny_gemm"]  # which kernel paths ran (None: not built)
    assert paths is None or set(paths) == {"wide_min_rows", "zmm_blocks"}
    assert "machine" in proc.stdout and "torch thread(s)" in proc.stdout
    (report,) = data["shapes"]
    assert report["shape"] == "custom"
    modes = {(r["mode"], r["concurrency"], r["prompts"]) for r in report["rows"]}
    assert ("target-only", 1, "code") in modes and ("spec adaptive", 2, "prose") in modes
    assert {("spec k=2", 1, "code"), ("spec k=6", 2, "prose")} <= modes  # the fixed-k sweep
    assert all(r["note"].startswith("median of 2: ") for r in report["rows"])  # no peers here
    assert {(a["prompts"], a["concurrency"]) for a in report["adaptive"]} == {
        ("code", 1),
        ("code", 2),
        ("prose", 1),
        ("prose", 2),
    }
    assert [p["t"] for p in report["forward_curve"]["1"]] == list(range(1, 10))
    assert report["lossless"] is True
    assert report["bound"]["speedup_bound"] > 0
    bound = report["bound"]
    assert bound["measured_decode_speedup"] > 0 and 0 < bound["prefill_share"] < 1
    assert 1 <= bound["end_to_end_ceiling"] <= bound["chain_ceiling"]  # (greedy: counted)
    assert "analytic bound" in proc.stdout and "adaptive k against the best fixed k" in proc.stdout
    assert "decoding alone" in proc.stdout and "ceiling of any chain" in proc.stdout


def test_bench_wide_shape_builds_and_reports_it(tmp_path: Path) -> None:
    proc = specctl(
        "bench", "--shape", "wide", "--no-peers", "--concurrency", "1", "--ks", "2",
        "-k", "2", "--num-prompts", "1", "--max-tokens", "4", "--out", tmp_path,
        "--threads", "1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (report,) = json.loads((tmp_path / "bench.json").read_text())["shapes"]
    assert report["shape"] == "wide" and "weight" in report["shape_description"]
    config = json.loads((tmp_path / "wide-target-i16384" / "config.json").read_text())
    assert config["intermediate_size"] == 16384
    assert report["lossless"] is True
    assert "target shape wide" in proc.stdout


def test_bench_samples_at_a_temperature(tmp_path: Path) -> None:
    """`--temperature`: every specctl configuration samples (seeded), the report says so and
    does not compare the draws with target-only's; the figures are all there."""
    target, draft = demo_pair_dirs()
    proc = specctl(
        "bench", "--target", target, "--draft", draft, "--no-peers", "--concurrency", "1",
        "--ks", "2", "-k", "2", "--num-prompts", "2", "--max-tokens", "6", "--out", tmp_path,
        "--threads", "1", "--repeats", "1", "--temperature", "0.8",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (report,) = json.loads((tmp_path / "bench.json").read_text())["shapes"]
    assert report["temperature"] == 0.8 and report["lossless"] is None
    assert report["config"]["temperature"] == "0.8"
    spec = [r for r in report["rows"] if r["mode"] == "spec k=2"]
    assert len(spec) == 2 and all(r["acceptance_rate"] is not None for r in spec)
    assert all(r["num_tokens"] == 12 for r in report["rows"])
    # every specctl row carries its time outside the passes and the controller's share of it
    for r in report["rows"]:
        assert 0.0 < r["choose_per_round_us"] < 1000.0 * r["overhead_per_round_ms"], r
    assert "sampled at T = 0.8, seeded" in proc.stdout
    assert (
        "sampled outputs are draws" in proc.stdout and "identical to target-only" not in proc.stdout
    )


def test_bench_without_batch_1_reports_no_bound(tmp_path: Path) -> None:
    """The analytic bound models batch 1: a run at other concurrencies says it was not
    computed (it crashed on a StopIteration) and compares outputs at its lowest one."""
    target, draft = demo_pair_dirs()
    proc = specctl(
        "bench", "--target", target, "--draft", draft, "--no-peers", "--concurrency", "2",
        "--ks", "2", "-k", "2", "--num-prompts", "2", "--max-tokens", "4", "--out", tmp_path,
        "--threads", "1", "--repeats", "1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (report,) = json.loads((tmp_path / "bench.json").read_text())["shapes"]
    assert report["bound"] is None
    assert report["lossless"] is True and report["lossless_concurrency"] == 2
    assert "not computed (concurrency 1 was not run)" in proc.stdout
    assert "identical to target-only at concurrency 2: True" in proc.stdout


@pytest.mark.parametrize(
    "args,option",
    [
        (["--shape", "tall"], "--shape"),
        (["--ks", "0"], "--ks"),
        (["-k", "0"], "-k"),
        (["--repeats", "0"], "--repeats"),
        (["--device", "tpu"], "--device must be one of cpu, cuda"),
        (["--temperature", "-0.5"], "--temperature must be in [0, 2], got -0.5"),
        (["--temperature", "3"], "--temperature must be in [0, 2], got 3"),
    ],
)
def test_bench_rejects_bad_options(tmp_path: Path, args: list[str], option: str) -> None:
    proc = specctl("bench", *args, "--out", tmp_path, "--no-peers")
    assert proc.returncode == 2
    assert option in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_bench_on_cuda_without_a_gpu_says_so(tmp_path: Path) -> None:
    proc = specctl("bench", "--device", "cuda", "--out", tmp_path, "--no-peers")
    assert proc.returncode == 2
    assert "--device cuda: torch sees no CUDA device here" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bench_rejects_bad_concurrency(tmp_path: Path) -> None:
    proc = specctl("bench", "--concurrency", "1,x", "--out", tmp_path, "--no-peers")
    assert proc.returncode == 2
    assert "--concurrency" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bench_narrow_shape_builds_the_target_to_the_cost_ratio(tmp_path: Path) -> None:
    """The narrow target is the demo target deepened until a step costs --cost-ratio draft
    steps, measured here: at 40x (the demo target is ~10x a warm draft step on this project's
    machines) it gains layers, all but the trained ones with zero output projections."""
    proc = specctl(
        "bench", "--shape", "narrow", "--cost-ratio", "40", "--no-peers", "--concurrency", "1",
        "--ks", "2", "-k", "2", "--num-prompts", "1", "--max-tokens", "4", "--out", tmp_path,
        "--threads", "1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    trained = json.loads((demo_pair_dirs()[0] / "config.json").read_text())["num_hidden_layers"]
    config = json.loads((tmp_path / "narrow-target-x40" / "config.json").read_text())
    assert config["num_hidden_layers"] > trained
    assert "measured cost ratio" in proc.stdout and "x the draft step" in proc.stdout
    (report,) = json.loads((tmp_path / "bench.json").read_text())["shapes"]
    assert report["shape"] == "narrow" and report["lossless"] is True
