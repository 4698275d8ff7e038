"""`python -m bench.linear_bench`: a row per row count with every backend, clear errors."""

import subprocess

from daemon.runtime.model import skinny
from tests.bench.bench_module import run_bench_module


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench_module("linear_bench", *args)


def test_prints_a_row_per_row_count() -> None:
    result = _run("--rows", "1,5", "--layers", "1", "--repeats", "1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("rows"))
    assert "mkl" in header and "onednn" in header
    assert ("skinny" in header) == skinny.available()
    rows = [line.split()[0] for line in lines if line.strip()[:1].isdigit() and "MB" not in line]
    assert rows == ["1", "5"]


def test_a_real_models_layer_shapes() -> None:
    """`--shape`: a decoder layer's projections and MLP (Qwen2.5 0.5B's: 60 MB), every backend."""
    result = _run("--shape", "qwen2.5-0.5b", "--rows", "1,3", "--layers", "1", "--repeats", "1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("qwen2.5-0.5b: 1 decoder layers' projections, 60 MB"), lines[0]
    rows = [line.split()[0] for line in lines if line.strip()[:1].isdigit()]
    assert rows == ["1", "3"]


def test_bad_options_are_named() -> None:
    for args in (
        ["--rows", "0"],
        ["--layers", "0"],
        ["--repeats", "0"],
        ["--rows", "1,x"],
        ["--shape", "gpt-5"],
    ):
        result = _run(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr
