"""Loads under way on one machine see each other's memory (load_ledger.py): a load that would
not fit beside them waits for them, one past its wait is refused naming them, and a load
killed part-way holds nothing. The other loads are real processes."""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from daemon.runtime.errors import ModelLoadError
from daemon.runtime.model.load_ledger import LEDGER_ENV, LoadLedger
from daemon.runtime.model.memory_guard import HEADROOM, loading, require_room, room_on

GIB = 1 << 30
REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")

# another process's load: records `nbytes` on the cpu, says so, holds it `hold_s` (forever: -1)
HOLDER = """
import sys, time
from pathlib import Path
from daemon.runtime.model.load_ledger import LoadLedger
ledger = LoadLedger(Path(sys.argv[1]))
nbytes, hold_s = int(sys.argv[2]), float(sys.argv[3])
left, _ = ledger.claim("cpu", nbytes, "a test's load", lambda: 1 << 62, 0)  # room: any
assert left >= nbytes, left
print("held", flush=True)
time.sleep(hold_s if hold_s >= 0 else 3600)
ledger.release()
print("released", flush=True)
"""


@pytest.fixture
def ledger_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "ledger"
    monkeypatch.setenv(LEDGER_ENV, str(where))
    return where


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        process.kill()
        process.wait(timeout=30)


def _hold(
    started: list[subprocess.Popen[str]], where: Path, nbytes: int, hold_s: float
) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(where), str(nbytes), str(hold_s)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    started.append(process)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "held"
    return process


def _usable() -> int:
    room = room_on(CPU)
    assert room is not None
    return room.free_bytes - int(HEADROOM * room.total_bytes)


def test_a_load_waits_for_one_under_way_and_then_takes_its_room(
    ledger_dir: Path, holders: list[subprocess.Popen[str]]
) -> None:
    """The other load claims all the usable memory for 1.5 s: 1 GiB, which fits alone, waits
    for it (its memory would be counted twice otherwise), then passes."""
    holder = _hold(holders, ledger_dir, _usable(), 1.5)
    began = time.monotonic()
    with loading():
        require_room(GIB, CPU, "1 GiB", "none")
        waited = time.monotonic() - began
        assert [p.name.split("-")[0] for p in ledger_dir.glob("*.json")] == [str(os.getpid())]
    assert not list(ledger_dir.glob("*.json")), "the load's record outlived it"
    assert holder.stdout is not None and holder.stdout.readline().strip() == "released"
    assert waited >= 1.0, f"did not wait for the load under way ({waited:.2f} s)"


def test_past_its_wait_a_load_is_refused_naming_the_others_and_a_killed_one_holds_nothing(
    ledger_dir: Path, holders: list[subprocess.Popen[str]]
) -> None:
    holder = _hold(holders, ledger_dir, _usable(), -1)
    began = time.monotonic()
    with pytest.raises(ModelLoadError) as error:
        require_room(GIB, CPU, "the weights", "lower it", wait_s=0.6)
    assert time.monotonic() - began >= 0.6
    said = str(error.value)
    assert said.startswith("the weights needs 1.00 GiB and this node's memory")
    assert f"about to be taken by loads under way on this machine (pid {holder.pid}: " in said
    assert said.endswith(": lower it")
    holder.send_signal(signal.SIGKILL)  # killed mid-load: its record names a dead process
    holder.wait(timeout=30)
    began = time.monotonic()
    require_room(GIB, CPU, "the weights", "lower it", wait_s=30)
    assert time.monotonic() - began < 5
    assert not list(ledger_dir.glob("*.json")), "the dead load's record was kept"


def test_a_load_that_holds_a_record_does_not_wait_and_a_failed_one_releases(
    ledger_dir: Path, holders: list[subprocess.Popen[str]]
) -> None:
    """A second check inside a load that already holds room is refused at once (two loads
    each holding room and waiting for the other would wait out their whole timeout)."""
    with pytest.raises(RuntimeError, match="the read failed"), loading():
        require_room(GIB, CPU, "the cache", "none")
        holder = _hold(holders, ledger_dir, _usable(), -1)
        began = time.monotonic()
        with pytest.raises(ModelLoadError, match="pid"):
            require_room(GIB, CPU, "the weights", "none", wait_s=30)
        assert time.monotonic() - began < 5, "a load holding room waited for another"
        raise RuntimeError("the read failed")
    records = [json.loads(p.read_text()) for p in ledger_dir.glob("*.json")]
    assert [r["pid"] for r in records] == [holder.pid], "the failed load's record was kept"


def test_records_of_a_reused_pid_or_torn_are_ignored(ledger_dir: Path) -> None:
    ledger_dir.mkdir()
    # this very process's pid, but another start time: a process that exited, its pid reused
    stale = {"pid": os.getpid(), "start": "1", "device": "cpu", "bytes": 1 << 60, "what": "x"}
    (ledger_dir / "old.json").write_text(json.dumps(stale))
    (ledger_dir / "torn.json").write_text('{"pid": 1, "st')
    require_room(GIB, CPU, "1 GiB", "none", wait_s=30)
    assert not list(ledger_dir.glob("*.json"))


def test_other_devices_loads_do_not_count(ledger_dir: Path) -> None:
    ledger = LoadLedger(ledger_dir)
    assert ledger.claim("cuda-abc", 1 << 60, "elsewhere", lambda: 1 << 60, 0)[0] == 1 << 60
    try:
        require_room(GIB, CPU, "1 GiB", "none", wait_s=0)
    finally:
        ledger.release()
