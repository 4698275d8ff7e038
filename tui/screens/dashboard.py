"""Dashboard: is speculation paying off? Acceptance rate and tokens/s over the last minutes,
acceptance by draft position, accepted tokens per round, k, batch size, latency, GPU use per
node and the newest requests, read from the store once a second by a worker. A store that is
missing, locked or broken is named on the status line; the last figures stay on screen."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import on, work
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.widget import Widget
from textual.widgets import DataTable, Label, Static
from textual.worker import get_current_worker

from tui import formatting as fmt
from tui.messages import DashboardRead
from tui.screens.base import SpecctlScreen
from tui.widgets.figures import gpu_use, headline_figures, position_bars
from tui.widgets.trend import Trend

if TYPE_CHECKING:
    from db import RequestRecord
    from tui.core.dashboard import DashboardData, DashboardReader, DashboardReading

# fixed widths: an auto-sized header catches up with its rows a refresh late (a flicker)
REQUEST_COLUMNS = {
    "Request": 14,
    "Prompt": 6,
    "Output": 6,
    "Accepted": 9,
    "TTFT": 7,
    "Latency": 8,
    "End": 7,
}
STALE_AFTER_S = 10.0  # samples come once a second while serving
STATE_STYLES = {"ok": "", "missing": "yellow", "busy": "yellow", "error": "red"}


def request_row(record: RequestRecord) -> tuple[str | Text, ...]:
    accepted = (
        f"{record.num_accepted_tokens}/{record.num_draft_tokens}"
        if record.num_draft_tokens
        else fmt.MISSING
    )
    return (
        record.request_id[-12:],
        str(record.num_prompt_tokens),
        str(record.num_output_tokens),
        accepted,
        fmt.number(record.ttft_ms, 0, " ms"),
        fmt.number(record.e2e_latency_ms, 0, " ms"),
        record.finish_reason,
    )


def status_text(reading: DashboardReading, store_path: Path) -> Text:
    data = reading.data
    text = Text()
    if data.deployment is not None:
        deployment = data.deployment
        text.append(f"{deployment.name} ", "bold")
        text.append(f"{deployment.status} ")
        if deployment.endpoint:
            text.append(f"{deployment.endpoint} ", "cyan")
        if deployment.status_message:
            text.append(f"({deployment.status_message}) ", "dim")
    elif reading.state == "ok":
        text.append("no deployment applied yet ", "dim")
    latest = data.latest
    if latest is not None and data.read_unix_s - latest.time_unix_s > STALE_AFTER_S:
        since = fmt.age(data.read_unix_s - latest.time_unix_s)
        text.append(f"· newest sample {since} (is the serving process running?) ", "yellow")
    if reading.state == "ok":
        text.append(f"· store {fmt.path(store_path)}", "dim")
    else:
        text.append(f"store {reading.state}: {reading.message}", STATE_STYLES[reading.state])
    return text


class DashboardScreen(SpecctlScreen):
    MODE = "dashboard"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("r", "refresh", "Refresh")]

    def __init__(self) -> None:
        super().__init__()
        self._reader: DashboardReader | None = None
        self._shown_requests: tuple[tuple[int | None, str], ...] | None = None

    def compose_body(self) -> Iterable[Widget]:
        yield Static("Reading the store…", id="dash-status", classes="status-line")
        with VerticalScroll(id="dash-body"):
            with Horizontal(id="dash-trends"):
                yield Trend("Acceptance rate", id="trend-acceptance")
                yield Trend("Tokens/s", id="trend-tokens")
            yield Static(id="dash-figures")
            with Horizontal(id="dash-middle"):
                yield Static(id="dash-positions")
                yield Static(id="dash-gpus")
            yield Label("Recent requests", classes="section-title")
            yield DataTable(id="request-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one("#request-table", DataTable)
        for label, width in REQUEST_COLUMNS.items():
            table.add_column(label, width=width)
        self.refresh_every(self.specctl.settings.dashboard_refresh_s, self.action_refresh)
        self.action_refresh()

    def on_unmount(self) -> None:
        if self._reader is not None:
            self._reader.close()

    def action_refresh(self) -> None:
        self.read_in_background("store", self._read_store)

    @work(thread=True, group="store")
    def _read_store(self) -> None:
        if self._reader is None:
            from tui.core.dashboard import DashboardReader

            settings = self.specctl.settings
            self._reader = DashboardReader(settings.home.db_file, settings.dashboard_window_minutes)
        reading = self._reader.read()
        if not get_current_worker().is_cancelled:
            self.post_message(DashboardRead(reading))

    @on(DashboardRead)
    def _show_reading(self, message: DashboardRead) -> None:
        reading = message.reading
        line = self.query_one("#dash-status", Static)
        line.update(status_text(reading, self.specctl.settings.home.db_file))
        line.set_class(reading.state != "ok", "-problem")
        self._show_data(reading.data)

    def _show_data(self, data: DashboardData) -> None:
        samples = data.samples
        latest = data.latest
        rates = [s.acceptance_rate for s in samples if s.acceptance_rate is not None]
        self.query_one("#trend-acceptance", Trend).show(
            rates, fmt.percent(latest.acceptance_rate if latest else None)
        )
        self.query_one("#trend-tokens", Trend).show(
            [s.tokens_per_s for s in samples],
            fmt.number(latest.tokens_per_s if latest else None, 1),
        )
        self.query_one("#dash-figures", Static).update(headline_figures(latest))
        positions = latest.per_position_acceptance if latest else []
        self.query_one("#dash-positions", Static).update(position_bars(positions))
        self.query_one("#dash-gpus", Static).update(gpu_use(data.gpu_latest))
        self._show_requests(data.requests)

    def _show_requests(self, requests: tuple[RequestRecord, ...]) -> None:
        """Rebuild the table only when the newest requests changed: most refreshes bring new
        samples but no finished request, and a rebuilt table is the refresh's dearest part."""
        shown = tuple((record.id, record.request_id) for record in requests)
        if shown == self._shown_requests:
            return
        self._shown_requests = shown
        table = self.query_one("#request-table", DataTable)
        table.clear()
        for record in requests:
            table.add_row(*request_row(record))
