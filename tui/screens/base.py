"""What every screen has: the mode bar on top, the footer with its keys below, a way to hear
that the cluster file changed, background readings that never pile up, and a refresh that
runs while the screen shows."""

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, cast

from textual import on
from textual.app import ComposeResult
from textual.screen import Screen
from textual.timer import Timer
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
        self._readers: dict[str, Worker] = {}  # the reading of each kind last started
        self._pending: dict[str, Callable[[], Worker]] = {}  # the newest request while it runs
        self._refresh_timer: Timer | None = None
        self._refresh: Callable[[], object] | None = None

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

    def refresh_every(self, seconds: float, refresh: Callable[[], object]) -> None:
        """Call `refresh` every `seconds` while this screen shows, and as it shows again."""
        self._refresh = refresh
        self._refresh_timer = self.set_interval(seconds, refresh)

    def on_screen_suspend(self) -> None:
        if self._refresh_timer is not None:
            self._refresh_timer.pause()

    def on_screen_resume(self) -> None:
        if self._refresh_timer is not None and self._refresh is not None:
            self._refresh_timer.resume()
            self._refresh()

    def read_in_background(self, key: str, start: Callable[[], Worker]) -> None:
        """Start a reading unless one of this kind runs; else start the newest request made
        meanwhile once it ends (an older one is dropped: its arguments may be stale), so
        slow readings (an unreachable node) never pile up."""
        running = self._readers.get(key)
        if running is not None and running.state not in _FINISHED:
            self._pending[key] = start
            return
        # a request pending behind a reading that ended but whose end is not handled yet is
        # older than this one: dropped, or it would run after this one with stale arguments
        self._pending.pop(key, None)
        self._readers[key] = start()

    @on(Worker.StateChanged)
    def _reading_ended(self, event: Worker.StateChanged) -> None:
        if event.state not in _FINISHED:
            return
        for key, worker in list(self._readers.items()):
            if worker is event.worker and key in self._pending:
                self._readers[key] = self._pending.pop(key)()
