"""Apply and down for the Launch screen: the same `apply_deployment` and `take_down` that
`specctl apply` and `specctl down` run, in a child process (`tui.core.launch_child`: apply is a
Ray driver and imports ray and torch, which the TUI's process never does), its events passed
on as they come. Nothing here raises: a failure, whatever its kind, becomes an outcome naming
what went wrong. The child runs in a session of its own: quitting the TUI stops following it
(within a second) but does not interrupt an apply half-way."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from specctl.home import SpecctlHome
    from tui.core.session import ConfigSession

CHILD_LOG_NAME = "tui-launch.log"  # the child's stderr, under $SPECCTL_HOME
WATCH_LOG_NAME = "tui-watch.log"  # a watch's stderr and steps, appended (it outlives the TUI)
WATCH_LOG_MAX_BYTES = 4 << 20  # past this, a new watch moves it to tui-watch.log.1 first
WATCH_STOP_WAIT_S = 10.0  # a watch stops at once, or once the apply under way is done
APPLY_TIMEOUT_S = 1800.0  # shard loading (900 s) + health (120 s) + cluster start, with room
DOWN_TIMEOUT_S = 300.0
LOG_TAIL_CHARS = 1500


class LaunchEvents(Protocol):
    def step(self, name: str, state: str, detail: str = "") -> None: ...

    def loading(self, shard_id: str, node: str, loaded_bytes: int, total_bytes: int) -> None: ...


@dataclass(frozen=True, slots=True)
class LaunchOutcome:
    action: str  # "apply", "watch" or "down"
    is_ok: bool
    message: str  # the endpoint, what was left over, or what went wrong
    endpoint: str | None = None


StopFollowing = Callable[[], bool]  # True once the caller no longer wants events (the TUI quit)


def apply_session(
    session: ConfigSession, home: SpecctlHome, events: LaunchEvents, stop: StopFollowing
) -> LaunchOutcome:
    """Save the file when it has unsaved changes (apply reads the file), then apply it."""
    not_saved = _save_first(session, events, "apply")
    if not_saved is not None:
        return not_saved
    return run_child("apply", [str(session.path)], home, events, APPLY_TIMEOUT_S, stop)


def watch_session(
    session: ConfigSession,
    home: SpecctlHome,
    events: LaunchEvents,
    stop: StopFollowing,
    interval_s: float,
) -> LaunchOutcome:
    """`specctl apply FILE --watch SECONDS` from the TUI: save, apply with each step shown,
    then leave the watch running in a session of its own (it outlives the TUI; its later
    steps go to WATCH_LOG_NAME)."""
    not_saved = _save_first(session, events, "watch")
    if not_saved is not None:
        return not_saved
    args = [str(session.path), f"{interval_s:g}"]
    rotate_watch_log(home)
    return run_child(
        "watch", args, home, events, APPLY_TIMEOUT_S, stop, log_name=WATCH_LOG_NAME, outlives=True
    )


def rotate_watch_log(home: SpecctlHome) -> None:
    """Move a watch log past WATCH_LOG_MAX_BYTES to `.1` (the one there before is dropped),
    so that watches started here for months keep one bounded log and its predecessor. Not
    while a watch runs: it writes there (this start is then refused, and says so)."""
    from specctl.apply.watch_record import watch_lock_held

    path = home.root / WATCH_LOG_NAME
    try:
        if path.stat().st_size <= WATCH_LOG_MAX_BYTES or watch_lock_held(home):
            return
        path.replace(path.with_name(WATCH_LOG_NAME + ".1"))
    except OSError:
        return  # none yet, or not movable: appended to as it is


def stop_watch(home: SpecctlHome, wait_s: float = WATCH_STOP_WAIT_S) -> LaunchOutcome:
    """Stop the home's watch (started here, in a terminal or by its service); the deployment
    keeps running. Not ok where it would not stop within `wait_s`, or cannot be stopped."""
    from specctl.apply.watch_record import stop_watch as stop_home_watch

    stopping = stop_home_watch(home, wait_s)
    message = stopping.message[0].upper() + stopping.message[1:] + "."
    if stopping.pid is not None and stopping.stopped:
        message += " The deployment keeps running."
    return LaunchOutcome("watch", stopping.stopped, message)


def _save_first(session: ConfigSession, events: LaunchEvents, action: str) -> LaunchOutcome | None:
    """Save the file where it has unsaved changes (apply reads the file); an outcome where it
    could not be saved, None where the file is ready."""
    from specctl.config.errors import ConfigError

    if not session.is_dirty:
        return None
    events.step("save", "started", str(session.save_path))
    try:
        path, unchecked_why = session.save_checked()
    except (ConfigError, OSError) as error:
        events.step("save", "failed", str(error).splitlines()[0])
        return LaunchOutcome(action, False, f"Not applied: the file was not saved.\n{error}")
    unchecked = " (not all checked: a model's nodes did not answer)"
    events.step("save", "done", str(path) + (unchecked if unchecked_why else ""))
    return None


def take_down_home(home: SpecctlHome, events: LaunchEvents, stop: StopFollowing) -> LaunchOutcome:
    """`specctl down`'s steps, the watch's stop first among them, shown as they come."""
    return run_child("down", [], home, events, DOWN_TIMEOUT_S, stop)


def run_child(
    action: str,
    args: list[str],
    home: SpecctlHome,
    events: LaunchEvents,
    timeout_s: float,
    stop: StopFollowing,
    log_name: str = CHILD_LOG_NAME,
    outlives: bool = False,
) -> LaunchOutcome:
    """`outlives`: the child goes on after a good outcome (a watch); it is not waited for."""
    home.ensure()
    log_path = home.root / log_name
    with log_path.open("a" if outlives else "w") as log:
        if outlives:  # appended to: what this start logs is read from here on
            log.write(f"---- {time.strftime('%Y-%m-%d %H:%M:%S')} {action} {' '.join(args)}\n")
            log.flush()
        log_start = log.tell()
        child = subprocess.Popen(
            [sys.executable, "-m", "tui.core.launch_child", action, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
            env={**os.environ, "SPECCTL_HOME": str(home.root)},
        )
    assert child.stdout is not None
    outcome = _follow(action, child, events, time.monotonic() + timeout_s, stop)
    # nothing more is read from it: a write to a closed pipe is ignored, one to a full pipe
    # would stop it (a watch's first apply the TUI quit during, say)
    child.stdout.close()
    if outcome is None and stop():
        _reap_in_background(child, action)
        return LaunchOutcome(action, False, f"{action} goes on in process {child.pid}")
    if outcome is None:
        if child.poll() is None:
            child.kill()
        _wait_or_kill(child)
        tail = _tail(log_path, log_start)
        why = f"exited with status {child.returncode}" if child.returncode else "gave no outcome"
        return LaunchOutcome(action, False, f"{action} {why}; its log ({log_path}) ends:\n{tail}")
    if outlives and outcome.is_ok:  # (it closed its end: its later steps go to its log)
        _reap_in_background(child, action)
        return outcome
    _wait_or_kill(child)
    return outcome


def _reap_in_background(child: subprocess.Popen[str], action: str) -> None:
    """Reaped when it ends (stopped from here or elsewhere), while the TUI runs."""
    threading.Thread(target=child.wait, name=f"{action}-reaper", daemon=True).start()


def _wait_or_kill(child: subprocess.Popen[str]) -> None:
    """It said its outcome, so it ends: wait for that, and kill it where it hangs."""
    try:
        child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):  # (stuck in the kernel)
            child.wait(timeout=30)


def _tail(log_path: Path, start: int) -> str:
    """The end of what this run wrote to its log, from offset `start`."""
    try:
        with log_path.open("rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(start, size - LOG_TAIL_CHARS))
            return log.read().decode(errors="replace").strip()
    except OSError as error:
        return f"(unreadable: {error})"


def _follow(
    action: str,
    child: subprocess.Popen[str],
    events: LaunchEvents,
    deadline: float,
    stop: StopFollowing,
) -> LaunchOutcome | None:
    """Pass the child's events on until its outcome line, its exit, the deadline, or `stop`."""
    assert child.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline and not stop():
            if not selector.select(timeout=1.0):
                continue
            line = child.stdout.readline()
            if not line:
                return None  # the child exited without an outcome
            outcome = _dispatch(action, line, events)
            if outcome is not None:
                return outcome
    return None


def _dispatch(action: str, line: str, events: LaunchEvents) -> LaunchOutcome | None:
    try:
        record: dict[str, Any] = json.loads(line)
    except ValueError:
        return None
    kind = record.get("kind")
    if kind == "step":
        events.step(str(record["name"]), str(record["state"]), str(record.get("detail", "")))
    elif kind == "loading":
        events.loading(
            str(record["shard_id"]),
            str(record["node"]),
            int(record["loaded_bytes"]),
            int(record["total_bytes"]),
        )
    elif kind == "outcome":
        endpoint = record.get("endpoint")
        return LaunchOutcome(action, bool(record["is_ok"]), str(record["message"]), endpoint)
    return None
