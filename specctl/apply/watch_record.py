"""`watch.json` in the home: the `apply --watch` keeping this home's deployment running, so
that `specctl status` can say whether anything is, and a second watch is refused (two would
repair the same fault twice over).

A record names its process by pid and start time (what tells it from a later process given
the same pid): one whose process is gone reads as no watch.
"""

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from daemon.specd.process_tree import process_start_ticks


class WatchRunning(Exception):
    """Another watch keeps this home's deployment already; the message names it."""


@dataclass(slots=True)
class WatchRecord:
    pid: int
    start_ticks: int | None
    interval_s: float
    config_path: str
    started_at: float  # unix time
    repairs: int = 0  # applies it ran
    last_repair_at: float | None = None
    last_outcome: str | None = None  # "repaired", or what failed

    @staticmethod
    def for_this_process(interval_s: float, config_path: str) -> "WatchRecord":
        pid = os.getpid()
        return WatchRecord(pid, process_start_ticks(pid), interval_s, config_path, time.time())

    def is_alive(self) -> bool:
        return process_start_ticks(self.pid) == self.start_ticks is not None

    def describe(self) -> str:
        """One line: "pid 123, every 30 s since 05:40:12; 2 repairs, the last at ...: ..."."""
        since = time.strftime("%H:%M:%S", time.localtime(self.started_at))
        line = f"pid {self.pid}, every {self.interval_s:g} s since {since}"
        if not self.repairs or self.last_repair_at is None:
            return line + "; no repair so far"
        at = time.strftime("%H:%M:%S", time.localtime(self.last_repair_at))
        plural = "s" if self.repairs > 1 else ""
        return line + f"; {self.repairs} repair{plural}, the last at {at}: {self.last_outcome}"

    def save(self, path: Path) -> None:
        staged = path.with_suffix(f".{self.pid}.tmp")
        staged.write_text(json.dumps(asdict(self), indent=2))
        os.replace(staged, path)


def live_watch(path: Path) -> WatchRecord | None:
    """The watch keeping the home's deployment, None where none runs (no record, a damaged
    one, or one whose process is gone)."""
    try:
        raw: Any = json.loads(path.read_text())
        record = WatchRecord(**raw)
        if type(record.pid) is not int or record.pid < 2:
            return None
    except (OSError, ValueError, TypeError):
        return None
    return record if record.is_alive() else None


def claim(path: Path, interval_s: float, config_path: str) -> WatchRecord:
    """This process's record written; WatchRunning where another live watch holds the home."""
    running = live_watch(path)
    if running is not None and running.pid != os.getpid():
        raise WatchRunning(already_running(running))
    record = WatchRecord.for_this_process(interval_s, config_path)
    record.save(path)
    return record


def already_running(running: WatchRecord) -> str:
    return (
        f"a watch already keeps this home's deployment running ({running.describe()}; "
        f"{running.config_path}): stop it first (kill {running.pid}, or stop its service)"
    )


def clear(path: Path, record: WatchRecord) -> None:
    """The record removed, where it is still this one's (a later watch's is left alone)."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        if WatchRecord(**json.loads(path.read_text())).pid == record.pid:
            path.unlink()
