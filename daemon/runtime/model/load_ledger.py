"""The memory that model loads under way on this machine are about to take, kept in files.

A shard checks the device's free memory before it allocates (memory_guard.py), but shards
that load at the same moment on one machine (tensor-parallel ranks, pipeline stages, two
local Ray nodes) each see the same free memory: each may pass while together they do not fit.
So a load records what it needs here, in a file per load under a directory every process of
this user on the machine shares, from its check until its weights are in memory. A check
counts what the others have recorded as taken; where the load would not fit beside them, it
waits for them to finish (their memory is then in use, and the free memory says so) and
checks again, rather than refusing: their figures count memory they may already hold.

A load that holds a record never waits for another (no two loads wait on each other). Records
of processes that have exited (killed mid-load too) are ignored and removed: a record names
its process by pid and start time, which a pid reused since does not match.
"""

import contextlib
import fcntl
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

LEDGER_ENV = "SPECCTL_LOAD_LEDGER"  # the directory, where not the default
WAIT_S = 600.0  # the longest a load waits for others on its device to finish
POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class Pending:
    """A load under way in another process."""

    pid: int
    nbytes: int
    what: str


def ledger_dir() -> Path:
    """Shared by every process of this user on the machine: /dev/shm (a tmpfs each machine
    has once), else the temporary directory."""
    where = os.environ.get(LEDGER_ENV)
    if where:
        return Path(where)
    base = Path("/dev/shm")
    if not (base.is_dir() and os.access(base, os.W_OK)):
        import tempfile

        base = Path(tempfile.gettempdir())
    return base / f"specctl-loads-{os.getuid()}"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None
    where it has exited."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces or ")"
    return stat[stat.rindex(")") + 2 :].split()[19]


class LoadLedger:
    """This process's records, by device key ("cpu", "cuda-<uuid>")."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or ledger_dir()
        self._own: dict[str, Path] = {}
        self._self = (os.getpid(), _start_time(os.getpid()) or "")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(self.directory / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # held for a few file reads: never long
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _others(self, device: str) -> list[Pending]:
        """Under the lock: other live processes' loads on `device`; dead ones' records go."""
        found: list[Pending] = []
        for path in self.directory.glob("*.json"):
            if path in self._own.values():
                continue
            try:
                record = json.loads(path.read_text())
                pid, started = int(record["pid"]), str(record["start"])
                entry = Pending(pid, int(record["bytes"]), str(record["what"]))
                key = str(record["device"])
            except (OSError, ValueError, KeyError, TypeError):
                path.unlink(missing_ok=True)  # torn or foreign: no load can be known by it
                continue
            if _start_time(pid) != started:
                path.unlink(missing_ok=True)
                continue
            if key == device:
                found.append(entry)
        return found

    def holds(self, device: str) -> bool:
        return device in self._own

    def claim(
        self, device: str, nbytes: int, what: str, usable: Callable[[], int], wait_s: float = WAIT_S
    ) -> tuple[int, list[Pending]]:
        """Record `nbytes` for `device` where they fit beside the others' loads, waiting up to
        `wait_s` for those to finish where they do not (not where this process already holds
        a record on it). `usable`: the device's usable bytes now, asked at each try.

        Returns the bytes left beside the others' loads at the last try, and those loads:
        nothing is recorded where `nbytes` exceed them."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._locked():
                others = self._others(device)
                room = usable() - sum(o.nbytes for o in others)
                if nbytes <= room:
                    self._record(device, nbytes, what)
                    return room, others
            if not others or self.holds(device) or time.monotonic() >= deadline:
                return room, others
            time.sleep(POLL_S)

    def _record(self, device: str, nbytes: int, what: str) -> None:
        pid, started = self._self
        path = self._own.get(device) or self.directory / f"{pid}-{uuid.uuid4().hex[:8]}.json"
        previous = 0
        if path.exists():
            with contextlib.suppress(OSError, ValueError, KeyError):
                previous = int(json.loads(path.read_text())["bytes"])
        record = {"pid": pid, "start": started, "device": device, "what": what}
        record["bytes"] = previous + nbytes
        staged = path.with_suffix(".tmp")
        staged.write_text(json.dumps(record))
        staged.replace(path)  # never read half written
        self._own[device] = path

    def release(self) -> None:
        """This process's loads are done (or failed): their memory is in use now, or free."""
        with self._locked():
            for path in self._own.values():
                path.unlink(missing_ok=True)
        self._own.clear()
