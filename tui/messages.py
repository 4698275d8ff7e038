"""Messages from the TUI's workers to its screens. Readings that come once a second (nodes,
the dashboard, shard loading progress) replace a pending one of their kind (`can_replace`):
a screen that falls behind shows the newest reading, not a backlog.

The payload types are imported for type checking only: importing them pulls in the store and
the planner, which the first frame must not wait for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from tui.core.dashboard import DashboardReading
    from tui.core.launch import LaunchOutcome
    from tui.core.logs import LogChunk
    from tui.core.models import ModelEntry, ModelPair
    from tui.core.nodes import NodeStatus
    from tui.core.verdict import AssignVerdict


@dataclass
class NodesRead(Message):
    statuses: list[NodeStatus]
    problem: str | None = None  # why no node could be read (the cluster file is invalid ...)

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, NodesRead)


@dataclass
class CatalogRead(Message):
    entries: list[ModelEntry]
    pairs: list[ModelPair]


@dataclass
class VerdictReady(Message):
    verdict: AssignVerdict

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, VerdictReady)


@dataclass
class DashboardRead(Message):
    reading: DashboardReading

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, DashboardRead)


@dataclass
class LogRead(Message):
    source: str  # "server" or a node's name
    chunk: LogChunk


@dataclass
class StepChanged(Message):
    """A step of apply or down started, finished, was skipped or failed."""

    name: str
    state: str
    detail: str = ""


@dataclass
class ShardLoading(Message):
    shard_id: str
    node: str
    loaded_bytes: int
    total_bytes: int

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ShardLoading) and message.shard_id == self.shard_id


@dataclass
class LaunchFinished(Message):
    outcome: LaunchOutcome


@dataclass
class SessionChanged(Message):
    """The cluster file was loaded, edited or saved: screens showing it look again."""

    revision: int
