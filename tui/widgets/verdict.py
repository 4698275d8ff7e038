"""The planner's verdict on the Assign screen: fits / does not fit / unknown / invalid, the
problems first (what to change), then the warnings, then every choice in words."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

if TYPE_CHECKING:
    from tui.core.verdict import AssignVerdict

STYLES = {
    "fits": "bold green",
    "does_not_fit": "bold red",
    "unknown": "bold yellow",
    "invalid": "bold red",
}


def verdict_text(verdict: AssignVerdict) -> Text:
    text = Text()
    text.append(f"● {verdict.headline}\n", STYLES[verdict.kind])
    for problem in verdict.problems:
        text.append(f"✗ {problem}\n", "red")
    for warning in verdict.warnings:
        text.append(f"! {warning}\n", "yellow")
    if verdict.plan is not None:
        text.append(f"endpoint {verdict.plan.endpoint}\n", "dim")
        for device in verdict.plan.devices:
            budget = device.budget_bytes
            use = f"{device.planned_bytes / 2**30:.1f} GiB"
            use += f" of {budget / 2**30:.1f} GiB" if budget else " (budget unknown)"
            text.append(f"{'+'.join(device.nodes)} {device.device}: {use}\n", "cyan")
    for sentence in verdict.explanation:
        text.append(f"· {sentence}\n")
    return text


class VerdictPanel(VerticalScroll):
    """Scrolls when the explanation is longer than the screen (80x24)."""

    can_focus = True

    def compose(self) -> ComposeResult:
        yield Static("Checking…", id="verdict-text", markup=False)

    def show(self, verdict: AssignVerdict) -> None:
        self.query_one("#verdict-text", Static).update(verdict_text(verdict))

    def show_text(self, text: str) -> None:
        self.query_one("#verdict-text", Static).update(text)
