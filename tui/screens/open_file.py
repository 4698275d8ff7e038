"""The dialog that asks which cluster file to open: a path (relative to the current
directory, `~` allowed), checked to exist before the dialog closes."""

from pathlib import Path
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static


class OpenFileScreen(ModalScreen[Path | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: Path) -> None:
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="open-dialog"):
            yield Label("Open a cluster file (Enter: open, Escape: cancel)")
            yield Input(str(self.current), id="open-path")
            yield Static(id="open-problem", markup=False)

    @on(Input.Submitted, "#open-path")
    def _submitted(self, event: Input.Submitted) -> None:
        path = Path(event.value.strip()).expanduser()
        if not event.value.strip():
            self.query_one("#open-problem", Static).update("Type the path of a cluster.toml.")
        elif not path.is_file():
            self.query_one("#open-problem", Static).update(f"{path}: no such file")
        else:
            self.dismiss(path.resolve())

    def action_cancel(self) -> None:
        self.dismiss(None)
