"""`specctl apply FILE --watch SECONDS`: apply, then keep what was applied running.

Applying again repairs a deployment (a node whose raylet died is started again with its
shards, a verifier Ray gave up restarting is replaced), but only when someone applies. The
watch does it: every interval it reads the deployment's status (state.json, the serving
process's view of its shards: no Ray call, no node asked), and where something has been
broken for GRACE_S and two looks or more, it applies again what was applied: the file text
state.json keeps, from the file's path (an edit to the file since is not applied behind the
operator's back; the watch says so once). Broken is what an apply can mend: the serving process
gone, not answering or degraded, a shard failed, stopped or unreachable. A shard loading is not
(Ray restarts a dead actor itself, and it loads again), nor a damaged metrics sample; and the
grace outlasts the server's own look at its shards (every 2 s, 5 s at most), so that one stale
look, or a restart Ray has under way, is not taken for a fault. After a repair, successful or
not, the next waits double (up to MAX_BACKOFF_S, or the interval where longer) until a look
finds the deployment whole again: a fault an apply cannot mend is not applied at for ever.

A repair takes the home's lock like any apply, and there checks that what it was to apply is
still what is applied: a `specctl down`, or an apply of another file, since its look, ends or
redirects the watch instead of being undone. The watch ends when asked (SIGINT, SIGTERM: an
apply under way finishes first; a second SIGINT interrupts it) or when nothing is applied any
more. Every wait is bounded: a look by the status timeouts, a repair by apply's own.

One watch per home: it holds the home from before its first apply to its end, and its record
(pid, interval, repairs) is what `specctl status` and the TUI show (watch_record.py).
"""

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from specctl.apply.apply import AppliedSince
from specctl.apply.events import ApplyEvents
from specctl.apply.home_lock import HomeBusyError
from specctl.apply.shards import said
from specctl.apply.state import AppliedState, StateError
from specctl.apply.status import StatusReport, read_status
from specctl.apply.watch_record import WatchRecord
from specctl.home import SpecctlHome

STEP = "watch"
GRACE_LOOKS = 2  # looks in a row that find it broken...
GRACE_S = 10.0  # ...over at least this long, before it is repaired
MAX_BACKOFF_S = 300.0
BROKEN_STATES = frozenset({"failed", "stopped", "unreachable"})
SERVER = "the serving process "  # its problems: not running, not answering
# a watch stopped does not stop what it watched (`specctl down`, which stops it first, does)
LEFT_AS_IT_IS = "the deployment is left as it is"

Repair = Callable[[Path, str], object]  # (the file's path, the applied text) -> anything


class WatchError(Exception):
    """The watch cannot go on (state.json unreadable); the message says why."""


def watch(
    home: SpecctlHome,
    events: ApplyEvents,
    repair: Repair,
    interval_s: float,
    stop: threading.Event,
    record: WatchRecord,
    how_to_stop: str = "Ctrl+C stops watching",
) -> None:
    """Look every `interval_s` until `stop` is set or nothing is applied; repair with
    `repair` (apply_deployment of the applied text) what stays broken. `record`: the home's
    watch record (watch_record.holding_watch), its repairs kept there. `how_to_stop`: said
    as it starts."""
    if stop.is_set():  # asked during the first apply: it is done, and nothing more
        events.step(STEP, "done", f"stopped before watching; {LEFT_AS_IT_IS}")
        return
    events.step(STEP, "started", f"looking every {interval_s:g} s ({how_to_stop})")
    looks, since, wait_s, told_edited = 0, 0.0, interval_s, False
    while not stop.wait(wait_s):
        try:
            state = AppliedState.load(home.state_file)
        except StateError as exc:
            events.step(STEP, "failed", str(exc))
            raise WatchError(str(exc)) from None
        if state is None:
            events.step(STEP, "done", "nothing is applied any more: stopped watching")
            return
        if not told_edited and _edited(state):
            told_edited = True
            edited = f"{state.config_path} changed since it was applied; the watch keeps what "
            events.step(STEP, "skipped", edited + "was applied: apply the file to change it")
        why = broken(read_status(home))
        if not why:
            looks, wait_s = 0, interval_s
            continue
        looks, since = looks + 1, since if looks else time.monotonic()
        if looks < GRACE_LOOKS or time.monotonic() - since < GRACE_S:
            continue
        if stop.is_set():  # asked during this look (`specctl down`, say): no repair now
            break
        events.step(STEP, "started", f"repairing: {why}")
        looks, wait_s = 0, min(max(wait_s, interval_s) * 2, max(MAX_BACKOFF_S, interval_s))
        try:
            repair(Path(state.config_path), state.config_text)
        except (HomeBusyError, AppliedSince) as exc:  # another apply or down, since: look again
            events.step(STEP, "skipped", f"{said(exc)}: nothing repaired")
            wait_s = interval_s
            continue
        except Exception as exc:  # said, and tried again later: the watch outlives a failure
            _repaired(home, record, f"failed: {said(exc)}")
            events.step(STEP, "failed", f"{said(exc)} (next look in {wait_s:g} s)")
            continue
        _repaired(home, record, "repaired")
        events.step(STEP, "done", f"repaired (next look in {wait_s:g} s)")
    events.step(STEP, "done", f"stopped watching; {LEFT_AS_IT_IS}")


class StopEvent(threading.Event):
    """Set when a watch is asked to stop. `asked` is true from the signal's handler on, and
    is_set() with it; a wait() returns once the event itself is set, a moment later, from a
    thread (see stop_on_signals)."""

    asked = False

    def is_set(self) -> bool:
        return self.asked or super().is_set()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopEvent]:
    """An event SIGINT and SIGTERM set (a second SIGINT raises KeyboardInterrupt: an apply
    under way is interrupted), the process's handlers put back at the end."""
    stop = StopEvent()

    def asked_to_stop(signum: int, _frame: object) -> None:
        if stop.asked and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.asked = True
        # set from a thread of its own: the handler runs in the main thread, which may hold
        # the event's lock inside its wait, and set() would wait for it for ever
        threading.Thread(target=stop.set, name="watch-stop").start()

    previous = {s: signal.signal(s, asked_to_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)  # type: ignore[arg-type]


def _repaired(home: SpecctlHome, record: WatchRecord, outcome: str) -> None:
    record.repairs += 1
    record.last_repair_at, record.last_outcome = time.time(), outcome
    with contextlib.suppress(OSError):  # what status shows of the watch: the repair is done
        record.save(home)


def broken(report: StatusReport) -> str:
    """What an apply can mend in the deployment ("" when nothing: a shard loading, or the
    metrics history, is not broken)."""
    if report.deployment is None:
        return ""  # nothing applied (or state.json unreadable): the watch's loop says so
    problems = [p for p in report.problems if p.startswith(SERVER)]
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
        return Path(state.config_path).read_text(encoding="utf-8-sig") != state.config_text
    except OSError:
        return True
