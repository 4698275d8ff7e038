"""The process the TUI runs `apply` and `down` in: the same functions `specctl apply` and
`specctl down` call, whose events it prints as JSON lines for the TUI to show.

    python -m tui.core.launch_child apply CLUSTER.toml
    python -m tui.core.launch_child down

Apply joins the Ray cluster as a driver and so imports ray and torch; running it here keeps
the TUI's own process free of both. The event lines go to the stdout the process was started
with; anything a library prints goes to stderr (the TUI keeps it in a log file). The last line
is the outcome: {"kind": "outcome", "is_ok": ..., "message": ..., "endpoint": ...}.
"""

import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

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
    elif argv == ["down"]:
        run_down(home, events)
    else:
        events.outcome(False, f"usage: apply CLUSTER.toml | down (got {argv})")
        return 2
    return 0


if __name__ == "__main__":
    from specctl.quiet_exit import run_and_exit

    run_and_exit(lambda: sys.exit(main(sys.argv[1:])))
