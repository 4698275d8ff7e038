"""The serving benchmark runs end to end (tiny load, no vLLM): a smoke test, not a timing."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.serve_process import REPO

pytestmark = pytest.mark.slow


def test_serve_load_runs_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "serve_load.json"
    args = ["--clients", "2", "--duration-s", "2", "--max-tokens", "4", "--max-model-len", "256"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.serve_load", *args, "--no-vllm", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "specctl serve" in proc.stdout and "serving overhead:" in proc.stdout
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert row["num_errors"] == 0 and row["num_done"] == row["num_requests"] > 0
    assert row["num_tokens"] == 4 * row["num_requests"]
    assert report["overhead"]["num_tokens"] == 2 * 4
    assert report["notes"] == ["vLLM not run (--no-vllm or --url)"]
