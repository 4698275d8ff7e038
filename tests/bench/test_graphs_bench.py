"""`python -m bench.graphs_bench`: static passes against eager ones, side by side.

On this CPU the static variant runs uncaptured (the padding it adds is all it changes); on a
GPU it replays CUDA graphs. Either way both variants must emit the same greedy tokens."""

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.bench.bench_module import run_bench_module


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench_module("graphs_bench", *args)


def test_both_variants_side_by_side_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "graphs.json"
    result = _run("--device", "cpu", "--num-prompts", "2", "--max-tokens", "8",
                  "--concurrency", "1,2", "--repeats", "1", "--threads", "1",
                  "--json", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "greedy outputs identical across variants and modes: True" in result.stdout
    data = json.loads(out.read_text())
    runs = {(r["variant"], r["concurrency"], r["mode"]) for r in data["runs"]}
    assert runs == {(v, c, m) for v in ("static", "eager") for c in (1, 2)
                    for m in ("target-only", "spec k=4")}  # fmt: skip
    assert all(len(ms) == 9 and min(ms) > 0 for ms in data["forward_ms"].values())
    assert data["graph_shapes"] == {"target": [], "draft": []}  # nothing captured off a GPU
    assert data["lossless"] is True


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_a_gpu_is_a_clear_error() -> None:
    result = _run("--device", "cuda")
    assert result.returncode == 2
    assert "--device cuda: torch sees no CUDA device here" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_options_are_named() -> None:
    for args, said in ((["--concurrency", "1,x"], "not a comma-separated list"),
                       (["--repeats", "0"], "must be >= 1")):  # fmt: skip
        result = _run("--device", "cpu", *args)
        assert result.returncode == 2 and said in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
