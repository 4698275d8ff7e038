"""`python -m bench.native_pass_bench`: a row per (model, tokens), both paths timed; clear
errors for bad options and for a model the native pass does not run."""

import subprocess
from pathlib import Path

import pytest

from daemon.runtime.model import native
from tests.bench.bench_module import run_bench_module
from tests.tiny_models import make_tiny_checkpoint


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench_module("native_pass_bench", *args)


@pytest.mark.skipif(native.kernels() is None, reason="the native kernels are not built")
def test_prints_a_row_per_model_and_token_count() -> None:
    result = _run("--tokens", "1,3", "--repeats", "1")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip().startswith("│")]
    cells: list[list[str]] = []
    for line in lines:
        row = [cell.strip() for cell in line.split("│")[1:-1]]
        if row[1]:
            cells.append(row)
        else:  # a narrow terminal wraps a long model path onto the next line
            cells[-1][0] += row[0]
    assert [c[1] for c in cells] == ["1", "3", "1", "3"]  # the draft's rows, then the target's
    assert [c[0] for c in cells] == ["demo-models/draft"] * 2 + ["demo-models/target"] * 2
    assert all(float(c[2]) > 0 and float(c[3]) > 0 and float(c[4]) > 0 for c in cells)


def test_bad_options_are_named() -> None:
    result = _run("--tokens", "1,x")
    assert result.returncode == 2 and "not a comma-separated list" in result.stderr
    result = _run("--models", "/nonexistent/model")
    assert result.returncode == 2 and "holds no config.json" in result.stderr, result.stderr
    result = _run("--batch", "0")
    assert result.returncode == 2 and "--batch: must be >= 1" in result.stderr, result.stderr
    for result in (_run("--tokens", "1,x"), _run("--batch", "0")):
        assert "Traceback" not in result.stderr


@pytest.mark.skipif(native.kernels() is None, reason="the native kernels are not built")
def test_a_model_the_pass_does_not_run_is_named(tmp_path: Path) -> None:
    qk_norm = make_tiny_checkpoint(tmp_path / "qwen3", "qwen3")  # q/k norms: the module path
    result = _run("--models", str(qk_norm), "--repeats", "1")
    assert result.returncode == 2, result.stderr
    assert "the native pass does not run this model here" in result.stderr
    assert "Traceback" not in result.stderr
