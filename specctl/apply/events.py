"""How apply and down report progress: steps that start and end, and shards loading."""

from dataclasses import dataclass, field
from typing import Literal, Protocol

StepState = Literal["started", "done", "skipped", "failed"]


class ApplyEvents(Protocol):
    """Called from the thread running apply/down; a UI hands them to its own thread."""

    def step(self, name: str, state: StepState, detail: str = "") -> None:
        """A step ("validate", "plan", "ray nodes", "drafter r0", "verifier r0", "server",
        ...) started, finished, was not needed (`skipped`: already as asked), or failed."""
        ...

    def loading(self, shard_id: str, node: str, loaded_bytes: int, total_bytes: int) -> None:
        """A shard is reading its weights on `node`."""
        ...


@dataclass(slots=True)
class RecordedEvent:
    kind: Literal["step", "loading"]
    name: str
    state: str = ""
    detail: str = ""
    loaded_bytes: int = 0
    total_bytes: int = 0


@dataclass(slots=True)
class EventLog:
    """An `ApplyEvents` that keeps everything (tests, `--json` output)."""

    events: list[RecordedEvent] = field(default_factory=list)

    def step(self, name: str, state: StepState, detail: str = "") -> None:
        self.events.append(RecordedEvent("step", name, state, detail))

    def loading(self, shard_id: str, node: str, loaded_bytes: int, total_bytes: int) -> None:
        self.events.append(RecordedEvent("loading", shard_id, node, "", loaded_bytes, total_bytes))

    def steps(self, state: StepState | None = None) -> list[str]:
        return [e.name for e in self.events if e.kind == "step" and state in (None, e.state)]
