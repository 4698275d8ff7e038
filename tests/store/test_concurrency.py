"""One writer process writing as fast as it can and one reader process reading at the same
time, for a few seconds: no "database is locked", no busy reads, and the reader sees new rows."""

import json
import os
import subprocess
import sys
from pathlib import Path

from db import Store

from .helpers import deployment_row

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("store_processes.py")
SECONDS = 4.0


def _start(role: str, path: Path, deployment_id: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), role, str(path), str(deployment_id), str(SECONDS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


def _finish(process: subprocess.Popen[str]) -> tuple[dict, str]:
    try:
        stdout, stderr = process.communicate(timeout=SECONDS + 60)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        raise AssertionError(f"process hung: {stderr}") from None
    assert process.returncode == 0, stderr
    return json.loads(stdout.strip().splitlines()[-1]), stdout + stderr


def test_writer_and_reader_processes_never_see_a_lock(tmp_path: Path) -> None:
    path = tmp_path / "specctl.db"
    with Store.open(path, role="writer") as store:
        deployment_id = store.add_deployment(deployment_row())
    writer = _start("writer", path, deployment_id)
    reader = _start("reader", path, deployment_id)
    written, writer_output = _finish(writer)
    read, reader_output = _finish(reader)
    for output in (writer_output, reader_output):
        assert "locked" not in output and "busy" not in output
    assert written["errors"] == [] and read["errors"] == []
    assert written["num_batches"] > 50, written  # a real load: many transactions a second
    assert read["num_reads"] > 20, read
    assert read["num_distinct_latest"] > 5, read  # the reader saw the writer's progress
    with Store.open(path, role="reader") as store:
        latest = store.latest_sample(deployment_id)
        assert latest is not None and latest.tokens_per_s == 100.0 + written["num_batches"] - 1
