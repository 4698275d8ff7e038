"""Following logs for the Logs screen: the serving process's `server.log` (a local file) and
each node's specd log (`GET /v1/logs`, the last lines only). Each follower hands out the lines
that are new since it was last asked, and says plainly when it cannot (no file yet, node
unreachable, token refused) instead of raising.
"""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from specctl.config.cluster import ClusterConfig
from specctl.config.schema import NodeSpec
from tui.core.specd_client import SpecdProblem, get_specd_json

MAX_READ_BYTES = 1 << 20  # a first read of a large log shows its last MiB
SPECD_TAIL_LINES = 500
HEAD_BYTES = 64


@dataclass(frozen=True, slots=True)
class LogChunk:
    lines: tuple[str, ...]  # new complete lines, oldest first
    problem: str | None = None  # why nothing could be read, when it could not
    is_reset: bool = False  # the source started over (file truncated or replaced): clear first


class FileFollower:
    """New lines of a growing file; survives the file being missing, truncated or replaced
    (told by its inode, its size going down, or its first bytes changing)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._inode: int | None = None
        self._head = b""  # the file's first bytes when it was first read
        self._offset = 0
        self._partial = b""

    def read_new(self) -> LogChunk:
        try:
            with self.path.open("rb") as file:
                return self._read(file)
        except FileNotFoundError:
            return LogChunk((), f"{self.path}: no log yet (it appears when a deployment starts)")
        except OSError as error:
            return LogChunk((), f"{self.path}: {error.strerror}")

    def _read(self, file: BinaryIO) -> LogChunk:
        info = os.fstat(file.fileno())
        head = file.read(HEAD_BYTES)
        is_same = (
            info.st_ino == self._inode
            and info.st_size >= self._offset
            and head[: len(self._head)] == self._head
        )
        is_reset = self._inode is not None and not is_same
        if not is_same:
            self._inode, self._head = info.st_ino, head
            self._offset = max(0, info.st_size - MAX_READ_BYTES)
            self._partial = b""
        elif len(self._head) < HEAD_BYTES:
            self._head = head
        file.seek(self._offset)
        data = file.read(MAX_READ_BYTES)
        self._offset += len(data)
        complete, newline, self._partial = (self._partial + data).rpartition(b"\n")
        if not newline:
            return LogChunk((), None, is_reset)
        text = complete.decode("utf-8", errors="replace")
        return LogChunk(tuple(text.split("\n")), None, is_reset)


def new_lines(previous: list[str], current: list[str]) -> list[str]:
    """The lines of `current` (a tail of the log) that follow what `previous` (an earlier
    tail) ended with: the longest start of `current` that `previous` ends with is dropped."""
    for overlap in range(min(len(previous), len(current)), 0, -1):
        if previous[-overlap:] == current[:overlap]:
            return current[overlap:]
    return current


class SpecdLogFollower:
    """New lines of a node's specd log, from the last lines specd returns on each call."""

    def __init__(self, config: ClusterConfig, node: NodeSpec, timeout_s: float) -> None:
        self.config = config
        self.node = node
        self.timeout_s = timeout_s
        self._previous: list[str] = []

    def read_new(self) -> LogChunk:
        params = {"lines": SPECD_TAIL_LINES}
        try:
            body = get_specd_json(self.config, self.node, "/v1/logs", self.timeout_s, params)
        except SpecdProblem as error:
            return LogChunk((), str(error))
        lines = [str(line) for line in body.get("lines") or []]
        fresh = new_lines(self._previous, lines)
        self._previous = lines
        return LogChunk(tuple(fresh))
