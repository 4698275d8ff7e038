"""Launch: apply the cluster file (the same `apply_deployment` as `specctl apply`) with each
step live (validate, plan, Ray nodes, every shard loading with a progress bar, the endpoint),
and a plain message where a step fails; Watch applies it the same way, then leaves a watch
keeping it running (`specctl apply --watch`), which outlives the TUI, and stops one that runs;
Down stops everything apply started. Each runs in a worker; their events reach this screen as
messages."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import on, work
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Button, DataTable, Label, Static
from textual.worker import get_current_worker

from tui import formatting as fmt
from tui.messages import LaunchFinished, ShardLoading, StepChanged
from tui.screens.base import SpecctlScreen
from tui.widgets.shard_progress import ShardProgress

if TYPE_CHECKING:
    from tui.core.status import DeploymentStatus

STEP_COLUMNS = ("Step", "State", "Detail")
STATUS_EVERY_S = 5.0
STATE_MARKS = {
    "started": Text("… running", "yellow"),
    "done": Text("✓ done", "green"),
    "skipped": Text("= unchanged", "dim"),
    "failed": Text("✗ failed", "bold red"),
    "stopped": Text("✗ stopped", "bold red"),  # still running when the action failed
}


class ScreenEvents:
    """An `ApplyEvents` that posts each event to the screen (safe from any thread)."""

    def __init__(self, screen: LaunchScreen) -> None:
        self._post = screen.post_message

    def step(self, name: str, state: str, detail: str = "") -> None:
        self._post(StepChanged(name, state, detail))

    def loading(self, shard_id: str, node: str, loaded_bytes: int, total_bytes: int) -> None:
        self._post(ShardLoading(shard_id, node, loaded_bytes, total_bytes))


class LaunchScreen(SpecctlScreen):
    MODE = "launch"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "apply", "Apply"),
        Binding("w", "watch", "Watch"),
        Binding("d", "down", "Down"),
    ]

    is_busy: reactive[bool] = reactive(False)

    def __init__(self) -> None:
        super().__init__()
        self._step_rows: dict[str, int] = {}
        self._watched = False  # a watch kept the deployment running at the last reading

    def compose_body(self) -> Iterable[Widget]:
        with Horizontal(id="launch-buttons"):
            yield Button("Apply", id="apply", compact=True, variant="success")
            yield Button("Watch", id="watch", compact=True, variant="primary")
            yield Button("Down", id="down", compact=True, variant="error")
            yield Static(id="launch-state", classes="status-line", markup=False)
        yield Static(id="launch-file", markup=False)
        with VerticalScroll():
            yield DataTable(id="step-table", cursor_type="row")
            yield Label("Shards loading", classes="section-title")
            yield Vertical(id="shard-bars")
            yield Static(id="launch-message", markup=False)
            yield Label("Deployed shards", classes="section-title")
            yield Static(id="deployed-shards")

    def on_mount(self) -> None:
        self.query_one("#step-table", DataTable).add_columns(*STEP_COLUMNS)
        self.query_one("#launch-state", Static).update("Reading what is deployed…")
        self.show_current_status()
        # what changes elsewhere (a watch started or stopped, a down in a terminal) shows too
        self.refresh_every(STATUS_EVERY_S, self.show_current_status)

    def session_changed(self, revision: int) -> None:
        session = self.specctl.session
        if session is None:
            text = self.specctl.session_problem or "Reading the cluster file…"
        else:
            text = f"a: apply {fmt.path(session.path)}"
            if session.is_dirty:
                text += f" (modified: saved to {fmt.path(session.save_path)} first)"
            text += " · w: apply, then keep it running (a watch; w again stops it)"
            text += " · d: take the deployment down · apply, watch and down run on if you quit"
        self.query_one("#launch-file", Static).update(text)

    def watch_is_busy(self, is_busy: bool) -> None:
        for button in self.query(Button):
            button.disabled = is_busy

    # ---- actions ----

    @on(Button.Pressed, "#apply")
    def action_apply(self) -> None:
        session = self.specctl.session
        if self.is_busy or session is None:
            if session is None:
                self._finish_message(False, self.specctl.session_problem or "No cluster file open.")
            return
        self._start("apply", f"Applying {session.path}…")
        self._apply()

    @on(Button.Pressed, "#watch")
    def action_watch(self) -> None:
        """Start a watch, or stop the one keeping the deployment running."""
        if self.is_busy:
            return
        if self._watched:  # as shown: a watch gone since is said, one started since refuses
            self._start("watch", "Stopping the watch…")
            self._stop_watch()
            return
        session = self.specctl.session
        if session is None:
            self._finish_message(False, self.specctl.session_problem or "No cluster file open.")
            return
        self._start("watch", f"Applying {session.path}, then watching it…")
        self._apply(then_watch=True)

    @on(Button.Pressed, "#down")
    def action_down(self) -> None:
        if not self.is_busy:
            self._start("down", "Taking the deployment down…")
            self._down()

    def _start(self, action: str, text: str) -> None:
        self.is_busy = True
        self._step_rows.clear()
        self.query_one("#step-table", DataTable).clear()
        self.query_one("#shard-bars", Vertical).remove_children()
        self._finish_message(None, "")
        self.query_one("#launch-state", Static).update(text)

    @work(thread=True, exclusive=True, group="launch")
    def _apply(self, then_watch: bool = False) -> None:
        from tui.core.launch import apply_session, watch_session

        session = self.specctl.session
        assert session is not None
        worker = get_current_worker()
        home = self.specctl.settings.home
        events, stop = ScreenEvents(self), lambda: worker.is_cancelled
        if then_watch:
            interval_s = self.specctl.settings.watch_interval_s
            outcome = watch_session(session, home, events, stop, interval_s)
        else:
            outcome = apply_session(session, home, events, stop)
        self.post_message(LaunchFinished(outcome))

    @work(thread=True, exclusive=True, group="launch")
    def _stop_watch(self) -> None:
        from tui.core.launch import stop_watch

        self.post_message(LaunchFinished(stop_watch(self.specctl.settings.home)))

    @work(thread=True, exclusive=True, group="launch")
    def _down(self) -> None:
        from tui.core.launch import take_down_home

        worker = get_current_worker()
        home = self.specctl.settings.home
        outcome = take_down_home(home, ScreenEvents(self), lambda: worker.is_cancelled)
        self.post_message(LaunchFinished(outcome))

    @work(thread=True, exclusive=True, group="launch-status")
    def show_current_status(self) -> None:
        from tui.core.status import read_deployment_status

        status = read_deployment_status(self.specctl.settings.home)
        if not get_current_worker().is_cancelled:  # a newer reading was asked for since
            self.app.call_from_thread(self._show_status_if_idle, status)

    def _show_status_if_idle(self, status: DeploymentStatus) -> None:
        if self.is_busy:
            return
        try:
            button = self.query_one("#watch", Button)
        except NoMatches:  # the reading arrived after the screen was taken down (app exit)
            return
        self._watched = status.watch is not None
        label = "Stop watch" if self._watched else "Watch"
        if str(button.label) != label:
            button.label = label
            button.refresh(layout=True)  # (its width follows its label)
        shards = Text()
        for actor, role, node in status.shards:
            shards.append(f"{role:<9} ", "bold").append(f"{node:<16} ").append(f"{actor}\n", "dim")
        if status.watch:  # (the state line above shows one line: the deployment's)
            shards.append("\nkept running by a watch: ", "bold").append(status.watch)
        try:
            self.query_one("#launch-state", Static).update(status.summary())
            self.query_one("#deployed-shards", Static).update(shards)
        except NoMatches:  # the reading arrived after the screen was taken down (app exit)
            return

    # ---- events ----

    @on(StepChanged)
    def _step_changed(self, message: StepChanged) -> None:
        table = self.query_one("#step-table", DataTable)
        mark = STATE_MARKS.get(message.state, Text(message.state))
        if message.name in self._step_rows:
            row = self._step_rows[message.name]
            table.update_cell_at((row, 1), mark)
            table.update_cell_at((row, 2), message.detail)
        else:
            self._step_rows[message.name] = table.row_count
            table.add_row(message.name, mark, message.detail)

    @on(ShardLoading)
    def _shard_loading(self, message: ShardLoading) -> None:
        bars = self.query_one("#shard-bars", Vertical)
        found = [bar for bar in bars.query(ShardProgress) if bar.shard_id == message.shard_id]
        if found:
            found[0].show(message.loaded_bytes, message.total_bytes)
            return
        bar = ShardProgress(message.shard_id, message.node)
        bar.show(message.loaded_bytes, message.total_bytes)
        bars.mount(bar)

    @on(LaunchFinished)
    def _finished(self, message: LaunchFinished) -> None:
        outcome = message.outcome
        self.is_busy = False
        if not outcome.is_ok:
            self._mark_unfinished_steps()
        self._finish_message(outcome.is_ok, outcome.message)
        self.show_current_status()
        self.specctl.deployment_changed()

    def _mark_unfinished_steps(self) -> None:
        table = self.query_one("#step-table", DataTable)
        running = STATE_MARKS["started"]
        for row in self._step_rows.values():
            if table.get_cell_at((row, 1)) == running:
                table.update_cell_at((row, 1), STATE_MARKS["stopped"])

    def _finish_message(self, is_ok: bool | None, text: str) -> None:
        widget = self.query_one("#launch-message", Static)
        widget.update(text)
        widget.set_class(is_ok is True, "-ok")
        widget.set_class(is_ok is False, "-failed")
