"""Loads under way on one machine see each other's memory (load_ledger.py): a load that would
fit alone but not beside them waits for them, one past its wait is refused naming them, one
that would not fit even alone is refused at once, and a load killed part-way holds nothing.
The other loads are real processes; the memory is the machine's (each test asks 1 GiB and
the others claim far more than any machine has, so the free memory's moves do not matter)."""

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from daemon.runtime.errors import ModelLoadError
from daemon.runtime.model.load_ledger import LEDGER_ENV, LoadLedger
from daemon.runtime.model.memory_guard import allocated, device_key, loading, require_room

GIB = 1 << 30
HUGE = 1 << 50  # 1 PiB
REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")

# another process's load: records `nbytes` on this machine's memory, says so, and releases it
# once the file `release` exists (never where it is "-")
HOLDER = """
import sys, time, torch
from pathlib import Path
from daemon.runtime.model.load_ledger import LoadLedger
from daemon.runtime.model.memory_guard import device_key
ledger = LoadLedger(Path(sys.argv[1]))
nbytes, release = int(sys.argv[2]), sys.argv[3]
left, _ = ledger.claim(device_key(torch.device("cpu")), nbytes, "a test's load", lambda: 1 << 62)
assert left >= nbytes, left
print("held", flush=True)
while release == "-" or not Path(release).exists():
    time.sleep(0.05)
ledger.release()
print("released", flush=True)
time.sleep(3600)
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
    started: list[subprocess.Popen[str]], where: Path, nbytes: int, release: str = "-"
) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(where), str(nbytes), release],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    started.append(process)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "held"
    return process


def _records(where: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in where.glob("*.json")]


def test_a_load_waits_for_one_under_way_and_then_takes_its_room(
    ledger_dir: Path, holders: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    """1 GiB fits alone, not beside the other load's claim: it waits until that load ends."""
    release = tmp_path / "release"
    holder = _hold(holders, ledger_dir, HUGE, str(release))
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            with loading():
                require_room(GIB, CPU, "1 GiB", "none", wait_s=60)
                outcome.append(None)
                assert [r["pid"] for r in _records(ledger_dir)] == [os.getpid()]
        except BaseException as exc:  # handed to the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=load)
    thread.start()
    thread.join(timeout=1.0)
    assert thread.is_alive() and not outcome, "did not wait for the load under way"
    release.touch()
    thread.join(timeout=30)
    assert outcome == [None]
    assert holder.stdout is not None and holder.stdout.readline().strip() == "released"
    assert not _records(ledger_dir), "the load's record outlived it"


def test_past_its_wait_a_load_is_refused_naming_the_others_and_a_killed_one_holds_nothing(
    ledger_dir: Path, holders: list[subprocess.Popen[str]]
) -> None:
    holder = _hold(holders, ledger_dir, HUGE)
    began = time.monotonic()
    with pytest.raises(ModelLoadError) as error:
        require_room(GIB, CPU, "the weights", "lower it", wait_s=1.2)
    assert time.monotonic() - began >= 1.2
    said = str(error.value)
    assert said.startswith("the weights needs 1.00 GiB and this node's memory")
    assert f"still to be taken by loads under way on this machine (pid {holder.pid}: " in said
    assert re.search(r" GiB, waited for 1 s\): lower it$", said), said
    assert said.endswith(": lower it")
    holder.send_signal(signal.SIGKILL)  # killed mid-load: nobody holds its record any more
    holder.wait(timeout=30)
    assert len(_records(ledger_dir)) == 1
    began = time.monotonic()
    require_room(GIB, CPU, "the weights", "lower it", wait_s=30)
    assert time.monotonic() - began < 5
    assert not _records(ledger_dir), "the dead load's record was kept"


def test_what_would_not_fit_alone_is_refused_at_once(
    ledger_dir: Path, holders: list[subprocess.Popen[str]]
) -> None:
    """Waiting for the others cannot help a load larger than the free memory itself."""
    _hold(holders, ledger_dir, GIB)
    began = time.monotonic()
    with pytest.raises(ModelLoadError, match="still to be taken"):
        require_room(HUGE, CPU, "the weights", "none", wait_s=60)
    assert time.monotonic() - began < 5


def test_a_load_that_holds_a_record_does_not_wait_and_a_failed_one_releases(
    ledger_dir: Path, holders: list[subprocess.Popen[str]]
) -> None:
    """A second check inside a load that already holds room is refused at once (two loads
    each holding room and waiting for the other would wait out their whole timeout)."""
    with pytest.raises(RuntimeError, match="the read failed"), loading():
        require_room(GIB, CPU, "the cache", "none")
        holder = _hold(holders, ledger_dir, HUGE)
        began = time.monotonic()
        with pytest.raises(ModelLoadError, match="pid"):
            require_room(GIB, CPU, "the weights", "none", wait_s=30)
        assert time.monotonic() - began < 5, "a load holding room waited for another"
        raise RuntimeError("the read failed")
    assert [r["pid"] for r in _records(ledger_dir)] == [holder.pid], "the failed load's was kept"


def test_what_a_load_has_allocated_is_no_longer_counted(ledger_dir: Path) -> None:
    key = device_key(CPU)
    with loading():
        require_room(GIB, CPU, "the weights and cache", "none")
        allocated(CPU, GIB // 4)
        assert _records(ledger_dir)[0]["bytes"] == GIB - GIB // 4
        allocated(CPU, 2 * GIB)
        assert _records(ledger_dir)[0]["bytes"] == 0
        # nothing still to come: another load counts none of it (and never waits for it)
        other = LoadLedger(ledger_dir)
        assert other.claim(key, 1, "x", lambda: 1, wait_s=0) == (1, [])
        other.release()


def test_a_directory_not_this_users_alone_is_not_trusted(
    ledger_dir: Path, holders: list[subprocess.Popen[str]], caplog: pytest.LogCaptureFixture
) -> None:
    """Another user could have made it (in a sticky /dev/shm) and planted records: the check
    falls back to the free memory alone, and says so in the log."""
    _hold(holders, ledger_dir, HUGE)
    ledger_dir.chmod(0o755)
    with caplog.at_level(logging.WARNING):
        require_room(GIB, CPU, "1 GiB", "none", wait_s=30)
    assert "not this user's alone" in caplog.text and "other loads are not counted" in caplog.text


def test_other_devices_loads_do_not_count(ledger_dir: Path) -> None:
    ledger = LoadLedger(ledger_dir)
    assert ledger.claim("cuda-abc", HUGE, "elsewhere", lambda: HUGE, 0)[0] == HUGE
    try:
        require_room(GIB, CPU, "1 GiB", "none", wait_s=0)
    finally:
        ledger.release()
