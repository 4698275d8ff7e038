"""How `specctl apply` and `specctl down` show their progress in a terminal: one line per
step, a bar per shard while it loads its weights. `--json` prints the events instead, one
JSON object per line."""

import json
import sys
from types import TracebackType
from typing import TextIO

from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn

from specctl.apply.events import StepState
from specctl.console import make_console

MARKS: dict[str, str] = {
    "started": "[cyan]…[/]",
    "done": "[green]✓[/]",
    "skipped": "[dim]=[/]",
    "failed": "[red]✗[/]",
}


class ConsoleEvents:
    """An `ApplyEvents` for a terminal (stderr, so stdout keeps what scripts read)."""

    def __init__(self) -> None:
        self._console = make_console(stderr=True)
        self._progress = Progress(
            TextColumn("  loading {task.description}"),
            BarColumn(),
            DownloadColumn(),
            console=self._console,
            transient=True,
        )
        self._tasks: dict[str, TaskID] = {}
        self._loaded: set[str] = set()

    def __enter__(self) -> "ConsoleEvents":
        # anew each time (`apply --watch` enters once per repair): no bar left from the last
        self._tasks.clear()
        self._loaded.clear()
        self._progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for task in self._tasks.values():
            self._progress.remove_task(task)
        self._progress.stop()

    def step(self, name: str, state: StepState, detail: str = "") -> None:
        suffix = f" [dim]{detail}[/]" if detail and state != "failed" else f" {detail}"
        self._progress.console.print(f"{MARKS[state]} {name}{suffix if detail else ''}")

    def loading(self, shard_id: str, node: str, loaded_bytes: int, total_bytes: int) -> None:
        key = f"{shard_id} on {node}"
        if key in self._loaded:
            return  # later polls of a shard already loaded
        if key not in self._tasks:
            self._tasks[key] = self._progress.add_task(key, total=total_bytes or None)
        self._progress.update(self._tasks[key], completed=loaded_bytes, total=total_bytes or None)
        if total_bytes and loaded_bytes >= total_bytes:
            self._progress.remove_task(self._tasks.pop(key))
            self._loaded.add(key)


class JsonEvents:
    """An `ApplyEvents` printing one JSON object per event (for scripts and the TUI)."""

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out or sys.stdout

    def __enter__(self) -> "JsonEvents":
        return self

    def __exit__(self, *_: object) -> None:
        self._out.flush()

    def step(self, name: str, state: StepState, detail: str = "") -> None:
        self._print({"kind": "step", "name": name, "state": state, "detail": detail})

    def loading(self, shard_id: str, node: str, loaded_bytes: int, total_bytes: int) -> None:
        self._print(
            {
                "kind": "loading",
                "shard_id": shard_id,
                "node": node,
                "loaded_bytes": loaded_bytes,
                "total_bytes": total_bytes,
            }
        )

    def _print(self, record: dict[str, object]) -> None:
        self._out.write(json.dumps(record) + "\n")
        self._out.flush()
