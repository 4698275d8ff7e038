"""A figure with its recent history: the title, the newest value, a sparkline under them."""

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Sparkline, Static


class Trend(Vertical):
    def __init__(self, title: str, id: str) -> None:
        super().__init__(id=id)
        self.title = title

    def compose(self) -> ComposeResult:
        yield Static(f"{self.title}  –", classes="trend-title")
        yield Sparkline([], summary_function=max)

    def show(self, values: Sequence[float], shown_value: str) -> None:
        self.query_one(".trend-title", Static).update(f"{self.title}  [b]{shown_value}[/b]")
        self.query_one(Sparkline).data = list(values)
