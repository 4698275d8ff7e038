"""Apply and down for the Launch screen: the same `apply_deployment` and `take_down` that
`specctl apply` and `specctl down` run, in a child process (`tui.core.launch_child`: apply is a
Ray driver and imports ray and torch, which the TUI's process never does), its events passed
on as they come. Nothing here raises: a failure, whatever its kind, becomes an outcome naming
what went wrong. The child runs in a session of its own: quitting the TUI stops following it
(within a second) but does not interrupt an apply half-way."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from specctl.home import SpecctlHome
    from tui.core.session import ConfigSession

CHILD_LOG_NAME = "tui-launch.log"  # the child's stderr, under $SPECCTL_HOME
APPLY_TIMEOUT_S = 1800.0  # shard loading (900 s) + health (120 s) + cluster start, with room
DOWN_TIMEOUT_S = 300.0
LOG_TAIL_CHARS = 1500


class LaunchEvents(Protocol):
    def step(self, name: str, state: str, detail: str = "") -> None: ...

    def loading(self, shard_id: str, node: str, loaded_bytes: int, total_bytes: int) -> None: ...


@dataclass(frozen=True, slots=True)
class LaunchOutcome:
    action: str  # "apply" or "down"
    is_ok: bool
    message: str  # the endpoint, what was left over, or what went wrong
    endpoint: str | None = None


StopFollowing = Callable[[], bool]  # True once the caller no longer wants events (the TUI quit)


def apply_session(
    session: ConfigSession, home: SpecctlHome, events: LaunchEvents, stop: StopFollowing
) -> LaunchOutcome:
    """Save the file when it has unsaved changes (apply reads the file), then apply it."""
    from specctl.config.errors import ConfigError

    if session.is_dirty:
        events.step("save", "started", str(session.save_path))
        try:
            path, unchecked_why = session.save_checked()
        except (ConfigError, OSError) as error:
            events.step("save", "failed", str(error).splitlines()[0])
            return LaunchOutcome("apply", False, f"Not applied: the file was not saved.\n{error}")
        unchecked = " (not all checked: a model's nodes did not answer)"
        events.step("save", "done", str(path) + (unchecked if unchecked_why else ""))
    return run_child("apply", [str(session.path)], home, events, APPLY_TIMEOUT_S, stop)


def take_down_home(home: SpecctlHome, events: LaunchEvents, stop: StopFollowing) -> LaunchOutcome:
    return run_child("down", [], home, events, DOWN_TIMEOUT_S, stop)


def run_child(
    action: str,
    args: list[str],
    home: SpecctlHome,
    events: LaunchEvents,
    timeout_s: float,
    stop: StopFollowing,
) -> LaunchOutcome:
    home.ensure()
    log_path = home.root / CHILD_LOG_NAME
    with log_path.open("w") as log:
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
    if outcome is None and stop():
        return LaunchOutcome(action, False, f"{action} goes on in process {child.pid}")
    if outcome is None:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)
        tail = log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:].strip()
        why = f"exited with status {child.returncode}" if child.returncode else "gave no outcome"
        return LaunchOutcome(action, False, f"{action} {why}; its log ({log_path}) ends:\n{tail}")
    child.wait(timeout=30)
    return outcome


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
