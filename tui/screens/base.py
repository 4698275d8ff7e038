"""What every screen has: the mode bar on top, the footer with its keys below, a way to hear
that the cluster file changed, and background readings that never pile up."""

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, cast

from textual import on
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from tui.widgets.mode_bar import ModeBar

if TYPE_CHECKING:
    from tui.app import SpecctlApp

_FINISHED = (WorkerState.SUCCESS, WorkerState.ERROR, WorkerState.CANCELLED)


class SpecctlScreen(Screen[None]):
    MODE = ""  # the app mode this screen is the base of

    def __init__(self) -> None:
        super().__init__()
        self._readers: dict[str, tuple[Callable[[], Worker], Worker]] = {}
        self._read_again: set[str] = set()

    @property
    def specctl(self) -> "SpecctlApp":
        return cast("SpecctlApp", self.app)

    def compose(self) -> ComposeResult:
        yield ModeBar(self.MODE)
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> Iterable[Widget]:
        raise NotImplementedError

    def on_mount(self) -> None:
        self.watch(self.app, "session_revision", self.session_changed, init=True)

    def session_changed(self, revision: int) -> None:
        """The cluster file was loaded, edited or saved (revision 0: not loaded yet)."""

    def read_in_background(self, key: str, start: Callable[[], Worker]) -> None:
        """Start a reading unless one of this kind runs; then run one more when it ends, so
        the newest request is served and slow readings (an unreachable node) never pile up."""
        running = self._readers.get(key)
        if running is not None and running[1].state not in _FINISHED:
            self._read_again.add(key)
            return
        self._readers[key] = (start, start())

    @on(Worker.StateChanged)
    def _reading_ended(self, event: Worker.StateChanged) -> None:
        if event.state not in _FINISHED:
            return
        for key, (start, worker) in list(self._readers.items()):
            if worker is event.worker and key in self._read_again:
                self._read_again.discard(key)
                self._readers[key] = (start, start())
