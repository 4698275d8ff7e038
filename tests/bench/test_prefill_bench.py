"""`python -m bench.prefill_bench`: a row per prompt length, clear errors for bad lengths."""

import subprocess

from tests.bench.bench_module import run_bench_module


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench_module("prefill_bench", *args)


def test_prints_a_row_per_length() -> None:
    result = _run("--lengths", "8,24", "--repeats", "1")
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.strip().startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == ["8", "24"]


def test_bad_lengths_are_named() -> None:
    for bad, said in (("8,x", "not a comma-separated list"), ("0", "must be >= 1")):
        result = _run("--lengths", bad)
        assert result.returncode == 2 and said in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    for option in ("--repeats", "--threads"):
        result = _run(option, "0", "--lengths", "8")
        assert result.returncode == 2 and f"{option}: must be >= 1" in result.stderr
        assert "Traceback" not in result.stderr
    result = _run("--lengths", "100000")  # past the demo target's 2,048 positions
    assert result.returncode == 2 and "max_model_len" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
