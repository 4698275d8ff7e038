"""The memory that model loads under way on this machine are still to take, kept in files.

A shard checks the device's free memory before it allocates (memory_guard.py), but shards
that load at the same moment on one machine (tensor-parallel ranks, pipeline stages, two
local Ray nodes) each see the same free memory: each may pass while together they do not fit.
So a load records what it is still to allocate here, in a file per load under a directory
every process of this user on the machine shares, from its check until its weights are in
memory, lowering the figure as it allocates (what it has allocated, the free memory shows:
the KV cache once zero-filled; on a GPU, the weights as they are read).
A check counts the others' figures as taken; where the load would not fit beside them, but
would alone, it waits for them to finish and checks again.

A load that holds a record never waits for another (no two loads wait on each other). The
owner of a record holds an flock on it for the load's life, which the kernel drops when the
process ends however it ends: a record nobody holds is a load that died, and is removed. That
works across PID namespaces sharing the directory, with no /proc and no pid reuse to fear.

Best effort: where the directory cannot be used (not ours, a full or read-only /dev/shm), the
check falls back to the free memory alone (memory_guard.py says so in the log).
"""

import contextlib
import fcntl
import json
import os
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

LEDGER_ENV = "SPECCTL_LOAD_LEDGER"  # the directory, where not the default
WAIT_S = 300.0  # the longest a load waits for others (shard loads time out at 900 s)
POLL_S = 0.2


class LedgerError(OSError):
    """The directory cannot be trusted or used; the message says why."""


@dataclass(frozen=True, slots=True)
class Pending:
    """A load under way in another process."""

    pid: int
    nbytes: int  # still to allocate
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


def _checked_dir(directory: Path) -> None:
    """Made where missing; LedgerError unless it is a directory of this user's alone (in a
    sticky /dev/shm, another user could make it first and plant records)."""
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700, parents=True)
    info = directory.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise LedgerError(f"{directory} is not a directory")
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise LedgerError(f"{directory} is not this user's alone (owner {info.st_uid}, mode "
                          f"{stat.S_IMODE(info.st_mode):o})")  # fmt: skip


class LoadLedger:
    """This process's records, by device key (memory_guard.device_key)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or ledger_dir()
        self._own: dict[str, _OwnRecord] = {}  # each held under an flock

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        _checked_dir(self.directory)
        with open(self.directory / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # held for a few file reads: never long
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _others(self, device: str) -> list[Pending]:
        """Under the lock: other loads under way on `device`; dead ones' records go."""
        mine = {own.path for own in self._own.values()}
        found: list[Pending] = []
        for path in self.directory.glob("*.json"):
            if path in mine:
                continue
            try:
                with open(path) as record:
                    try:
                        fcntl.flock(record, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    except BlockingIOError:
                        raw = json.loads(record.read())  # held: a load under way
                    else:
                        path.unlink(missing_ok=True)  # nobody holds it: its load died
                        continue
                entry = Pending(int(raw["pid"]), int(raw["bytes"]), str(raw["what"]))
                key = str(raw["device"])
            except FileNotFoundError:
                continue
            except (ValueError, KeyError, TypeError):
                continue  # being written, or not ours: not counted
            if key == device and entry.nbytes > 0:
                found.append(entry)
        return found

    def holds(self, device: str) -> bool:
        return device in self._own

    def claim(
        self, device: str, nbytes: int, what: str, usable: Callable[[], int], wait_s: float = WAIT_S
    ) -> tuple[int, list[Pending]]:
        """Record `nbytes` for `device` where they fit beside the others' loads. Where they fit
        alone but not beside those, wait up to `wait_s` for them to finish (not where this
        process already holds a record on it: two loads would wait on each other).
        `usable`: the device's usable bytes now, asked at each try.

        Returns the bytes left beside the others' loads at the last try, and those loads:
        nothing is recorded where `nbytes` exceed them."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._locked():
                alone = usable()
                others = self._others(device)
                room = alone - sum(o.nbytes for o in others)
                if nbytes <= room:
                    self._record(device, nbytes, what)
                    return room, others
            if nbytes > alone or not others or self.holds(device):
                return room, others  # waiting for the others would not make it fit
            if time.monotonic() >= deadline:
                return room, others
            time.sleep(POLL_S)

    def allocated(self, device: str, nbytes: int) -> None:
        """`nbytes` of this process's load on `device` are allocated now (the free memory
        shows them): its record says that much less is still to come."""
        if device not in self._own:
            return
        own = self._own[device]
        own.nbytes = max(0, own.nbytes - nbytes)
        with self._locked():
            own.write()

    def _record(self, device: str, nbytes: int, what: str) -> None:
        """Under the lock."""
        own = self._own.get(device)
        if own is None:
            path = self.directory / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
            handle = open(path, "w")  # noqa: SIM115 (held open, and locked, until release)
            fcntl.flock(handle, fcntl.LOCK_EX)  # before any reader can look: under the lock
            own = self._own[device] = _OwnRecord(path, handle, device, 0, what)
        own.nbytes += nbytes
        own.write()

    def release(self) -> None:
        """This process's loads are done (or failed): their memory is in use now, or free."""
        try:
            with self._locked():
                for own in self._own.values():
                    own.path.unlink(missing_ok=True)
        finally:
            for own in self._own.values():
                own.handle.close()  # the flock goes with it: a record left behind reads dead
            self._own.clear()


@dataclass(slots=True)
class _OwnRecord:
    """One of this process's records: its file, held open under an flock, and its figure."""

    path: Path
    handle: IO[str]
    device: str
    nbytes: int  # still to allocate
    what: str

    def write(self) -> None:
        """Under the directory's lock, in place (the flock is on this file; readers read
        under the directory's lock, never half a write)."""
        record = {"pid": os.getpid(), "device": self.device, "bytes": self.nbytes,
                  "what": self.what}  # fmt: skip
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(json.dumps(record))
        self.handle.flush()
