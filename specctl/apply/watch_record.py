"""The `apply --watch` keeping a home's deployment running: one at a time per home, and seen
by `specctl status`.

A watch holds an flock on the home's watch.lock for its whole life, its first apply
included: a second watch is refused at once (two would repair each fault twice), and the
kernel drops the lock when the process ends however it ends, so a watch that died reads as
none (across PID namespaces too, with no pid reuse to fear). Beside it, watch.json says what
the watch is (pid, interval, file, repairs and the last outcome) for `status`; it counts only
while the lock is held.
"""

import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import IO

from specctl.home import SpecctlHome

MIN_INTERVAL_S = 0.5  # a watch's interval between two looks: at least...
MAX_INTERVAL_S = 86_400.0  # ...and at most a day (a wait past ~9e9 s overflows)
DEFAULT_TUI_INTERVAL_S = 30.0  # a watch started from the TUI (`specctl tui --watch-interval`)
READER_GRACE_S = 2.0  # a `status` looking at the lock holds it this long at most
STOP_WAIT_S = 10.0  # a watch stops at once, or once the apply under way is done


class WatchRunning(Exception):
    """Another watch keeps this home's deployment already; the message names it."""


@dataclass(slots=True)
class WatchRecord:
    pid: int
    interval_s: float
    config_path: str
    started_at: float  # unix time
    repairs: int = 0  # applies it ran
    last_repair_at: float | None = None
    last_outcome: str | None = None  # "repaired", or what failed

    def describe(self) -> str:
        """One line: "pid 123, every 30 s since 05:40:12; 2 repairs, the last at ...: ..."."""
        since = time.strftime("%H:%M:%S", time.localtime(self.started_at))
        line = f"pid {self.pid}, every {self.interval_s:g} s since {since}"
        if not self.repairs or self.last_repair_at is None:
            return line + "; no repair so far"
        at = time.strftime("%H:%M:%S", time.localtime(self.last_repair_at))
        plural = "s" if self.repairs > 1 else ""
        return line + f"; {self.repairs} repair{plural}, the last at {at}: {self.last_outcome}"

    def save(self, home: SpecctlHome) -> None:
        """Only by the watch holding the lock."""
        staged = home.watch_file.with_suffix(".tmp")
        staged.write_text(json.dumps(asdict(self), indent=2))
        os.replace(staged, home.watch_file)


_TYPES: dict[str, tuple[type, ...]] = {
    "pid": (int,),
    "interval_s": (int, float),
    "config_path": (str,),
    "started_at": (int, float),
    "repairs": (int,),
    "last_repair_at": (int, float, type(None)),
    "last_outcome": (str, type(None)),
}


def _lock_path(home: SpecctlHome) -> Path:
    return home.watch_file.with_suffix(".lock")


def _read(home: SpecctlHome) -> WatchRecord | None:
    """watch.json as written, None where missing or damaged (a hand edit, say)."""
    try:
        raw = json.loads(home.watch_file.read_text())
    except (OSError, ValueError):
        return None
    names = [f.name for f in fields(WatchRecord)]
    if not isinstance(raw, dict) or sorted(raw) != sorted(names):
        return None
    if not all(type(raw[name]) in _TYPES[name] for name in names):
        return None
    return WatchRecord(**raw)


def already_running(running: WatchRecord | None) -> str:
    said = f"{running.describe()}; {running.config_path}" if running else "its record unreadable"
    kill = f"kill {running.pid}, or " if running else ""
    return (
        f"a watch already keeps this home's deployment running ({said}): stop it first "
        f"({kill}stop its service)"
    )


def live_watch(home: SpecctlHome) -> WatchRecord | None:
    """The watch keeping the home's deployment, None where none runs. A watch whose record
    cannot be read (being written, or damaged) is None too: status says nothing of it."""
    try:
        with open(_lock_path(home)) as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read(home)  # held: a watch runs
            return None  # nobody holds it
    except OSError:
        return None


@contextlib.contextmanager
def holding_watch(home: SpecctlHome, interval_s: float, config_path: str) -> Iterator[WatchRecord]:
    """This process as the home's watch, from now (before its first apply) to the end of the
    block; WatchRunning where another watch holds the home."""
    home.ensure()
    handle: IO[str] = open(_lock_path(home), "a")  # noqa: SIM115 (held for the block)
    try:
        # a reader (`status`) holds it for a moment; a watch, for its life
        deadline = time.monotonic() + READER_GRACE_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise WatchRunning(already_running(_read(home))) from None
                time.sleep(0.05)
        record = WatchRecord(os.getpid(), interval_s, config_path, time.time())
        record.save(home)
        try:
            yield record
        finally:
            with contextlib.suppress(OSError):
                home.watch_file.unlink()  # ours: the lock is still held
    finally:
        handle.close()  # the lock goes with it


@dataclass(frozen=True, slots=True)
class WatchStop:
    pid: int | None  # the watch asked to stop; None: none ran
    stopped: bool  # it let the home go within the wait (or none ran)
    message: str


def stop_watch(home: SpecctlHome, wait_s: float = STOP_WAIT_S) -> WatchStop:
    """SIGTERM to the home's watch (one in a terminal, its service, the TUI's), then wait up
    to `wait_s` for it to let the home go: an apply under way finishes first. The process is
    checked first to be a watch with the home's watch lock open (a record left by a killed
    watch can name a pid now another process's), and signalled through a pidfd taken before
    that check (a pid reused in between is not signalled)."""
    watching = _watch_holding(home)
    if watching is None:
        if watch_lock_held(home):
            return WatchStop(
                None,
                False,
                f"a watch holds this home, but its record {home.watch_file} "
                "cannot be read: stop it where it runs (its terminal, or its service)",
            )
        return WatchStop(None, True, "no watch keeps this deployment running")
    pid = watching.pid
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return _wait_for_the_home(home, pid, wait_s)  # it ended meanwhile
    except OSError as exc:
        return WatchStop(pid, False, f"cannot stop the watch (pid {pid}): {exc.strerror}")
    try:
        not_it = _not_the_watch(home, pid)
        if not_it:
            return WatchStop(pid, False, not_it)
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
    except ProcessLookupError:
        pass  # it ended meanwhile
    except OSError as exc:  # another user's
        return WatchStop(
            pid,
            False,
            f"cannot stop the watch (pid {pid}): {exc.strerror}; stop it where it runs (its "
            "terminal, or `systemctl --user stop specctl-watch`)",
        )
    finally:
        os.close(pidfd)
    return _wait_for_the_home(home, pid, wait_s)


def _watch_holding(home: SpecctlHome) -> WatchRecord | None:
    """live_watch, given a moment where the lock is held but the record not written yet (a
    watch starting: it takes the lock, then writes its record)."""
    deadline = time.monotonic() + READER_GRACE_S
    while (watching := live_watch(home)) is None and watch_lock_held(home):
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
    return watching


def _wait_for_the_home(home: SpecctlHome, pid: int, wait_s: float) -> WatchStop:
    """Until the watch lock is free (the process ended, or is about to: the lock goes with
    its last descriptor), or another watch holds it."""
    deadline = time.monotonic() + wait_s
    while watch_lock_held(home) and ((now := live_watch(home)) is None or now.pid == pid):
        if time.monotonic() >= deadline:
            return WatchStop(
                pid,
                False,
                f"the watch (pid {pid}) was asked to stop: it stops once the apply "
                "under way is done",
            )
        time.sleep(0.2)
    return WatchStop(pid, True, f"the watch (pid {pid}) stopped")


def watch_lock_held(home: SpecctlHome) -> bool:
    """Whether a watch holds the home's watch lock (readers' shared holds do not count)."""
    try:
        with open(_lock_path(home)) as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            return False
    except OSError:
        return False


def _not_the_watch(home: SpecctlHome, pid: int) -> str:
    """Why `pid` is not the watch holding the home ("" where it is): its command line names
    no watch, it has not the home's watch lock open, or /proc/locks (where it shows the lock)
    names another holder."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        lock = os.stat(_lock_path(home))
        has_lock_open = any(
            (st := _stat_or_none(fd)) is not None
            and (st.st_dev, st.st_ino) == (lock.st_dev, lock.st_ino)
            for fd in Path(f"/proc/{pid}/fd").iterdir()
        )
    except OSError as exc:
        return f"cannot tell whether pid {pid} is the watch holding this home: {exc}"
    as_cli = any(a == b"--watch" or a.startswith(b"--watch=") for a in argv)
    is_watch = as_cli or (b"tui.core.launch_child" in argv and b"watch" in argv)
    holders = _flock_holders(_lock_path(home))
    if is_watch and has_lock_open and (not holders or pid in holders):
        return ""
    return (
        f"the watch record names pid {pid}, which is not the watch holding this home (a record "
        f"left by a watch that was killed?): nothing was stopped; {home.watch_file}"
    )


def _stat_or_none(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)  # (a descriptor's link: the file it has open)
    except OSError:
        return None


def _flock_holders(path: Path) -> set[int]:
    """Pids /proc/locks shows holding an flock on `path` (empty where none shows: another PID
    namespace's holder, a file system whose device it names otherwise (btrfs), no /proc)."""
    try:
        st = os.stat(path)
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return set()
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders = set()
    for line in lines:  # "1: FLOCK  ADVISORY  WRITE 14802 fe:00:2244995 0 EOF" (waiters: "->")
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == device:
            with contextlib.suppress(ValueError):
                holders.add(int(parts[4]))
    return holders
