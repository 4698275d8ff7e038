"""The process the TUI runs `apply` and `down` in: the same functions `specctl apply` and
`specctl down` call, whose events it prints as JSON lines for the TUI to show.

    python -m tui.core.launch_child apply CLUSTER.toml
    python -m tui.core.launch_child watch CLUSTER.toml SECONDS
    python -m tui.core.launch_child down

Apply joins the Ray cluster as a driver and so imports ray and torch; running it here keeps
the TUI's own process free of both. The event lines go to the stdout the process was started
with; anything a library prints goes to stderr (the TUI keeps it in a log file). The last line
is the outcome: {"kind": "outcome", "is_ok": ..., "message": ..., "endpoint": ...}.

`watch` is `specctl apply FILE --watch SECONDS` for the TUI: the home held as its watch, the
file applied, the outcome line; then the event stream is closed (the TUI stops reading there,
and a pipe nobody reads would stop the watch once full) and the watch goes on, its steps
written to stderr as plain lines, until SIGTERM or SIGINT, or `specctl down`. It outlives the
TUI.
"""

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from specctl.apply.watch_record import MAX_INTERVAL_S, MIN_INTERVAL_S
from specctl.home import SpecctlHome


class JsonLineEvents:
    """An `ApplyEvents` that writes one JSON object per event; a closed pipe (the TUI quit)
    is ignored so that the apply or down under way still finishes."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def emit(self, record: dict[str, Any]) -> None:
        try:
            self._out.write(json.dumps(record) + "\n")
            self._out.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass

    def step(self, name: str, state: str, detail: str = "") -> None:
        self.emit({"kind": "step", "name": name, "state": state, "detail": detail})

    def loading(self, shard_id: str, node: str, loaded_bytes: int, total_bytes: int) -> None:
        record = {"kind": "loading", "shard_id": shard_id, "node": node}
        self.emit(record | {"loaded_bytes": loaded_bytes, "total_bytes": total_bytes})

    def outcome(self, is_ok: bool, message: str, endpoint: str | None = None) -> None:
        self.emit({"kind": "outcome", "is_ok": is_ok, "message": message, "endpoint": endpoint})

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._out.close()


class LogLineEvents:
    """An `ApplyEvents` writing a plain, timed line per step to `out` (a watch's log), and
    only the end of each shard's load."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def line(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._out.write(f"{time.strftime('%H:%M:%S')} {text}\n")
            self._out.flush()

    def step(self, name: str, state: str, detail: str = "") -> None:
        self.line(f"{name} {state}" + (f": {detail}" if detail else ""))

    def loading(self, shard_id: str, node: str, loaded_bytes: int, total_bytes: int) -> None:
        if loaded_bytes >= total_bytes:
            self.line(f"{shard_id} on {node}: loaded {total_bytes / 2**20:.1f} MiB")


class BothEvents:
    """Each event to the TUI's stream and to the log."""

    def __init__(self, stream: JsonLineEvents, log: LogLineEvents) -> None:
        self._both = (stream, log)

    def step(self, name: str, state: str, detail: str = "") -> None:
        for events in self._both:
            events.step(name, state, detail)

    def loading(self, shard_id: str, node: str, loaded_bytes: int, total_bytes: int) -> None:
        for events in self._both:
            events.loading(shard_id, node, loaded_bytes, total_bytes)


def _why(error: BaseException) -> str:
    return str(error).strip() or type(error).__name__


def run_apply(config_path: Path, home: SpecctlHome, events: JsonLineEvents) -> None:
    from specctl.apply.apply import apply_deployment

    try:
        result = apply_deployment(config_path, home, events)
    except Exception as error:  # every failure becomes the outcome line, never a traceback
        events.outcome(False, f"Apply failed: {_why(error)}")
        return
    changed = ", ".join(result.changed) if result.changed else "nothing (already as asked)"
    events.outcome(True, f"Endpoint ready: {result.endpoint}\nChanged: {changed}", result.endpoint)


def run_watch(
    config_path: Path, home: SpecctlHome, events: JsonLineEvents, interval_s: float
) -> int:
    from specctl.apply.apply import apply_deployment
    from specctl.apply.watch import LEFT_AS_IT_IS, WatchError, stop_on_signals, watch
    from specctl.apply.watch_record import WatchRunning, holding_watch

    with contextlib.ExitStack() as held:
        try:
            record = held.enter_context(holding_watch(home, interval_s, str(config_path.resolve())))
        except WatchRunning as error:
            events.outcome(False, f"Not applied: {error}")
            return 4
        except OSError as error:  # the home not writable, say
            events.outcome(False, f"Not applied: cannot record the watch: {error}")
            return 1
        stop = held.enter_context(stop_on_signals())  # SIGTERM lets the apply finish
        logged = LogLineEvents(sys.stderr)  # the log keeps it all: the TUI may have quit
        try:
            result = apply_deployment(config_path, home, BothEvents(events, logged))
        except Exception as error:  # every failure becomes the outcome line
            failed = f"Apply failed: {_why(error)}\nNo watch was started."
            logged.line(failed)
            events.outcome(False, failed)
            return 1
        changed = ", ".join(result.changed) if result.changed else "nothing (already as asked)"
        if stop.is_set():  # asked to stop during the first apply
            kept = f"The watch was stopped during its first apply; {LEFT_AS_IT_IS}"
        else:
            kept = f"Kept running by a watch: pid {os.getpid()}, every {interval_s:g} s"
        message = f"Endpoint ready: {result.endpoint}\nChanged: {changed}\n{kept}"
        logged.line(message.replace("\n", "; "))
        events.outcome(True, message, result.endpoint)
        events.close()

        def repair(path: Path, text: str) -> object:
            return apply_deployment(path, home, logged, as_applied=text)

        try:
            stopping = f"w on the TUI's Launch screen, or kill {os.getpid()}, stops it"
            watch(home, logged, repair, interval_s, stop, record, stopping)
        except WatchError:
            return 1
    return 0


def run_down(home: SpecctlHome, events: JsonLineEvents) -> None:
    from specctl.apply.down import take_down

    try:
        leftover = take_down(home, events)
    except Exception as error:  # every failure becomes the outcome line, never a traceback
        events.outcome(False, f"Down failed: {_why(error)}")
        return
    if leftover:
        events.outcome(False, f"Down left processes running: {', '.join(map(str, leftover))}")
    else:
        events.outcome(True, "Everything apply started is stopped.")


def main(argv: list[str]) -> int:
    events_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints from libraries go to stderr, not into the event stream
    events = JsonLineEvents(os.fdopen(events_fd, "w", buffering=1))
    home = SpecctlHome.resolve()
    if argv[:1] == ["apply"] and len(argv) == 2:
        run_apply(Path(argv[1]), home, events)
    elif argv[:1] == ["watch"] and len(argv) == 3 and _seconds(argv[2]) is not None:
        return run_watch(Path(argv[1]), home, events, float(argv[2]))
    elif argv == ["down"]:
        run_down(home, events)
    else:
        seconds = f"SECONDS ({MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g})"
        usage = f"apply CLUSTER.toml | watch CLUSTER.toml {seconds} | down"
        events.outcome(False, f"usage: {usage} (got {argv})")
        return 2
    return 0


def _seconds(text: str) -> float | None:
    try:
        seconds = float(text)
    except ValueError:
        return None
    return seconds if MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S else None  # (NaN: neither)


if __name__ == "__main__":
    from specctl.quiet_exit import run_and_exit

    run_and_exit(lambda: sys.exit(main(sys.argv[1:])))
