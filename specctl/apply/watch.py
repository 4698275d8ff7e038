"""`specctl apply FILE --watch SECONDS`: apply, then keep what was applied running.

Applying again repairs a deployment (a node whose raylet died is started again with its
shards, a verifier Ray gave up restarting is replaced), but only when someone applies. The
watch does it: every interval it reads the deployment's status (state.json, the serving
process's view of its shards: no Ray call, no node asked) and, when something has been broken
for GRACE_LOOKS looks in a row, applies again what was applied (the file text state.json
keeps, from the file's path: an edit to the file since is not applied behind the operator's
back; the watch says so once). A shard loading is not broken: Ray restarts a dead actor
itself, and the shard loads again. A repair that fails is tried again after a pause that
doubles, up to MAX_BACKOFF_S. The watch ends when asked (SIGINT, SIGTERM: an apply under way
finishes first) or when nothing is applied any more (`specctl down`). Every wait is bounded:
a look by the status timeouts, a repair by apply's own.
"""

import threading
from collections.abc import Callable
from pathlib import Path

from specctl.apply.events import ApplyEvents
from specctl.apply.shards import said
from specctl.apply.state import AppliedState, StateError
from specctl.apply.status import StatusReport, read_status
from specctl.home import SpecctlHome

STEP = "watch"
GRACE_LOOKS = 2  # looks in a row that find it broken before it is repaired
MAX_BACKOFF_S = 300.0
BROKEN_STATES = frozenset({"failed", "stopped", "unreachable", "unknown"})

Repair = Callable[[Path, str], object]  # (the file's path, the text to apply) -> anything


def watch(
    home: SpecctlHome,
    events: ApplyEvents,
    repair: Repair,
    interval_s: float,
    stop: threading.Event,
) -> None:
    """Look every `interval_s` until `stop` is set or nothing is applied; repair with
    `repair` (apply_deployment over the applied text) what stays broken."""
    events.step(STEP, "started", f"looking every {interval_s:g} s (Ctrl+C stops watching)")
    broken_looks, wait_s, told_edited = 0, interval_s, False
    while not stop.wait(wait_s):
        try:
            state = AppliedState.load(home.state_file)
        except StateError as exc:
            events.step(STEP, "failed", str(exc))
            break
        if state is None:
            events.step(STEP, "done", "nothing is applied any more: stopped watching")
            return
        why = broken(read_status(home))
        broken_looks = broken_looks + 1 if why else 0
        if not told_edited and _edited(state):
            told_edited = True
            edited = f"{state.config_path} changed since it was applied; the watch keeps what "
            events.step(STEP, "skipped", edited + "was applied: apply the file to change it")
        if broken_looks < GRACE_LOOKS:
            wait_s = interval_s
            continue
        events.step(STEP, "started", f"repairing: {why}")
        try:
            repair(Path(state.config_path), state.config_text)
        except Exception as exc:  # said, and tried again later: the watch outlives a failure
            wait_s = min(max(wait_s, interval_s) * 2, MAX_BACKOFF_S)
            events.step(STEP, "failed", f"{said(exc)} (trying again in {wait_s:g} s)")
            continue
        events.step(STEP, "done", "repaired")
        broken_looks, wait_s = 0, interval_s
    events.step(STEP, "done", "stopped watching; the deployment keeps running")


def broken(report: StatusReport) -> str:
    """What is broken in the deployment ("" when nothing; a shard loading is not broken)."""
    if report.deployment is None:
        return "; ".join(report.problems) or "nothing applied"
    problems = [*report.problems]
    if report.is_server_alive and report.server_status not in ("ready", None):
        problems.append(f"the serving process is {report.server_status}")
    problems += [
        f"{s.id} {s.state}" + (f" ({s.error})" if s.error else "")
        for s in report.shards
        if s.state in BROKEN_STATES
    ]
    return "; ".join(problems)


def _edited(state: AppliedState) -> bool:
    try:
        return Path(state.config_path).read_text() != state.config_text
    except OSError:
        return True
