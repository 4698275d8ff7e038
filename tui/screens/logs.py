"""Logs: the serving process's log (server.log under $SPECCTL_HOME), the log of a watch the
TUI started (tui-watch.log, once there is one) and each specd node's log (GET /v1/logs),
followed live by a worker once a second. Pick a source on the left; what a source cannot give
(no log yet, node unreachable, token refused) is said above the log."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import Label, ListItem, ListView, Log, Static
from textual.worker import get_current_worker

from tui.messages import LogRead
from tui.screens.base import SpecctlScreen

if TYPE_CHECKING:
    from tui.core.logs import FileFollower, SpecdLogFollower
    from tui.core.session import ConfigSnapshot

# the local logs' keys: not node names (a node may be called "server")
SERVER = "<server>"
WATCH = "<watch>"
MAX_LINES_KEPT = 5000


class LogsScreen(SpecctlScreen):
    MODE = "logs"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "clear", "Clear"),
        Binding("e", "end", "Follow end"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._sources: list[str] = [SERVER]
        self._lines: dict[str, deque[str]] = {SERVER: deque(maxlen=MAX_LINES_KEPT)}
        self._problems: dict[str, str | None] = {}
        self._followers: dict[str, FileFollower | SpecdLogFollower] = {}
        self._shown = SERVER
        # the cluster file's newest snapshot, and the one whose nodes are followed: state, not
        # a reading's argument, so that a poll requested after it cannot drop it
        self._snapshot: ConfigSnapshot | None = None
        self._followed: ConfigSnapshot | None = None

    def compose_body(self) -> Iterable[Widget]:
        with Horizontal():
            yield ListView(ListItem(Label("server.log"), name=SERVER), id="log-sources")
            with Vertical():
                yield Static(id="log-status", classes="status-line", markup=False)
                yield Log(id="log-view", max_lines=MAX_LINES_KEPT)

    def on_mount(self) -> None:
        self.refresh_every(self.specctl.settings.logs_refresh_s, self.action_poll)

    def session_changed(self, revision: int) -> None:
        session = self.specctl.session
        if revision and session is not None:
            self._snapshot = session.snapshot()
            self.action_poll()

    def action_poll(self) -> None:
        self.read_in_background("logs", self._follow)

    @work(thread=True, group="logs")
    def _follow(self) -> None:
        """Read every source's new lines; after a new snapshot, first follow its nodes' specd."""
        from tui.core.launch import WATCH_LOG_NAME
        from tui.core.logs import FileFollower, SpecdLogFollower

        home = self.specctl.settings.home
        if SERVER not in self._followers:
            self._followers[SERVER] = FileFollower(home.server_log)
        if WATCH not in self._followers and (home.root / WATCH_LOG_NAME).exists():
            self._followers[WATCH] = FileFollower(home.root / WATCH_LOG_NAME)
        snapshot = self._snapshot
        if snapshot is not self._followed:
            self._followed = snapshot
        else:
            snapshot = None
        config = None if snapshot is None else snapshot.check(read_models=False).config
        if config is not None:
            timeout_s = self.specctl.settings.probe_timeout_s
            remote = {node.name: node for node in config.nodes if not node.is_local}
            for name, follower in list(self._followers.items()):
                is_node = isinstance(follower, SpecdLogFollower)
                if is_node and (name not in remote or follower.node != remote[name]):
                    del self._followers[name]  # gone from the file, or moved
            for name, node in remote.items():
                if name not in self._followers:
                    self._followers[name] = SpecdLogFollower(config, node, timeout_s)
        for source, follower in list(self._followers.items()):
            chunk = follower.read_new()
            if get_current_worker().is_cancelled:
                return
            self.post_message(LogRead(source, chunk))

    @on(LogRead)
    def _log_read(self, message: LogRead) -> None:
        source, chunk = message.source, message.chunk
        if source not in self._lines:
            self._add_source(source)
        buffer = self._lines[source]
        if chunk.is_reset:
            buffer.clear()
        buffer.extend(chunk.lines)
        self._problems[source] = chunk.problem
        if source == self._shown:
            log = self.query_one("#log-view", Log)
            if chunk.is_reset:
                log.clear()
            log.write_lines(chunk.lines)
            self._show_status()

    def _add_source(self, source: str) -> None:
        self._sources.append(source)
        self._lines[source] = deque(maxlen=MAX_LINES_KEPT)
        item = ListItem(Label(_label(source)), name=source)
        self.query_one("#log-sources", ListView).append(item)

    @on(ListView.Highlighted, "#log-sources")
    def _source_chosen(self, event: ListView.Highlighted) -> None:
        if event.item is None or event.item.name is None or event.item.name == self._shown:
            return
        self._shown = event.item.name
        log = self.query_one("#log-view", Log)
        log.clear()
        log.write_lines(list(self._lines.get(self._shown, ())))
        self._show_status()

    def _show_status(self) -> None:
        problem = self._problems.get(self._shown)
        name = {SERVER: "server.log", WATCH: "tui-watch.log"}.get(
            self._shown, f"{self._shown}'s specd log"
        )
        count = len(self._lines.get(self._shown, ()))
        text = problem or f"{name}: {count} line(s), following"
        line = self.query_one("#log-status", Static)
        line.update(text)
        line.set_class(problem is not None, "-problem")

    def action_clear(self) -> None:
        self._lines[self._shown].clear()
        self.query_one("#log-view", Log).clear()
        self._show_status()

    def action_end(self) -> None:
        self.query_one("#log-view", Log).scroll_end(animate=False)


def _label(source: str) -> str:
    return "tui-watch.log" if source == WATCH else f"{source} (specd)"
