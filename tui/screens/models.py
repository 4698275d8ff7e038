"""Models: the model directories found at the cluster file's model paths, beside them and under
the search directories, with architecture, parameters, size on disk and vocabulary; and the
pairs that can serve as drafter and verifier. `v` / `d` put the highlighted model in that
role (adding it to [[models]] when the file does not name it yet)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import on, work
from textual.binding import Binding, BindingType
from textual.widget import Widget
from textual.widgets import DataTable, Label, Static

from tui import formatting as fmt
from tui.messages import CatalogRead
from tui.screens.base import SpecctlScreen

if TYPE_CHECKING:
    from specctl.config.document import ConfigDocument
    from tui.core.models import ModelEntry, ModelPair
    from tui.core.session import ConfigSnapshot

# fixed widths: an auto-sized header catches up with its rows a refresh late (a flicker)
MODEL_COLUMNS = {
    "Model": 22,
    "Arch": 7,
    "Params": 6,
    "On disk": 10,
    "Vocab": 7,
    "Layers": 6,
    "In file": 7,
}
PAIR_COLUMNS = {"Drafter": 22, "Verifier": 22, "Tokenizer": 16}


def model_row(entry: ModelEntry) -> tuple[str | Text, ...]:
    name = Text(entry.label, "bold" if entry.config_name else "")
    if entry.problem:
        return name, Text(entry.problem, "red"), "", "", "", "", ""
    if entry.on_node:
        on_disk: str | Text = Text(f"on {entry.on_node}", "cyan")
    else:
        on_disk = fmt.size(entry.size_on_disk_bytes) if entry.has_weights else "no weights"
    return (
        name,
        (entry.architecture or fmt.MISSING).removesuffix("ForCausalLM"),
        fmt.count(entry.num_params),
        on_disk,
        fmt.MISSING if entry.vocab_size is None else f"{entry.vocab_size:,}",
        fmt.MISSING if entry.num_layers is None else str(entry.num_layers),
        Text("yes", "green") if entry.config_name else Text("no", "dim"),
    )


def pair_row(pair: ModelPair) -> tuple[str | Text, ...]:
    checked = (
        Text("same", "green") if pair.is_tokenizer_checked else Text("vocab size only", "yellow")
    )
    return Text(pair.drafter.label), Text(pair.verifier.label), checked


class ModelsScreen(SpecctlScreen):
    MODE = "models"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("v", "use('verifier')", "Use as verifier"),
        Binding("d", "use('drafter')", "Use as drafter"),
        Binding("r", "rescan", "Rescan"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._entries: list[ModelEntry] = []
        self._scanned_revision = -1

    def compose_body(self) -> Iterable[Widget]:
        yield Static("Looking for models…", id="models-status", classes="status-line", markup=False)
        yield DataTable(id="model-table", cursor_type="row", zebra_stripes=True)
        yield Label("Drafter → verifier pairs (same vocabulary)", classes="section-title")
        yield DataTable(id="pair-table", cursor_type="row")
        yield Static(id="model-detail", classes="status-line", markup=False)

    def on_mount(self) -> None:
        for table_id, columns in (("#model-table", MODEL_COLUMNS), ("#pair-table", PAIR_COLUMNS)):
            table = self.query_one(table_id, DataTable)
            for label, width in columns.items():
                table.add_column(label, width=width)

    def session_changed(self, revision: int) -> None:
        if revision and self.specctl.session is not None:
            self.action_rescan()

    def action_rescan(self) -> None:
        session = self.specctl.session
        if session is None:
            return
        from tui.core.session import configured_model_dirs  # loaded with the session already

        with session.lock:
            configured = configured_model_dirs(session.document)
        snapshot = session.snapshot()
        extra = self.specctl.settings.model_dirs
        self.read_in_background("catalog", lambda: self._scan(configured, extra, snapshot))

    @work(thread=True, group="catalog")
    def _scan(
        self, configured: dict[str, Path], extra: tuple[Path, ...], snapshot: ConfigSnapshot
    ) -> None:
        from tui.core.models import find_pairs, scan_catalog

        # a model kept on its nodes alone is read through them: the file says which nodes load
        # it and with which token (its nodes and deployment valid: a model's own problems,
        # another model missing, do not stop this one being read)
        missing = any(not path.exists() for path in configured.values())
        config = snapshot.check(read_models=False).config if missing else None
        entries = scan_catalog(configured, extra, config)
        self.post_message(CatalogRead(entries, find_pairs(entries)))

    @on(CatalogRead)
    def _show_catalog(self, message: CatalogRead) -> None:
        self._entries = message.entries
        table = self.query_one("#model-table", DataTable)
        row = table.cursor_row
        table.clear()
        for entry in message.entries:
            table.add_row(*model_row(entry), key=str(entry.path))
        if message.entries:
            table.move_cursor(row=min(row, len(message.entries) - 1))
        pairs = self.query_one("#pair-table", DataTable)
        pairs.clear()
        for pair in message.pairs:
            pairs.add_row(*pair_row(pair))
        if not message.pairs:
            pairs.add_row(Text("no shared vocabulary", "dim"), "", "")
        num_in_file = sum(1 for e in message.entries if e.config_name)
        self.query_one("#models-status", Static).update(
            f"{len(message.entries)} model(s) found, {num_in_file} in the cluster file · "
            "v: verifier  d: drafter  r: rescan"
        )

    @on(DataTable.RowHighlighted, "#model-table")
    def _model_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if 0 <= event.cursor_row < len(self._entries):
            entry = self._entries[event.cursor_row]
            where = fmt.path(entry.path)
            if entry.on_node:
                where += f" on {entry.on_node} (read through its specd; not on this machine)"
            self.query_one("#model-detail", Static).update(where)

    def action_use(self, role: str) -> None:
        session = self.specctl.session
        table = self.query_one("#model-table", DataTable)
        if session is None or not 0 <= table.cursor_row < len(self._entries):
            return
        entry = self._entries[table.cursor_row]
        if entry.problem:
            self.notify(
                entry.problem, title="Cannot use this model", severity="error", markup=False
            )
            return
        name = session.edit(_assign_role(entry.path, role))
        self.specctl.session_edited()
        self.app.switch_mode("assign")
        self.app.notify(f"{name} is now the {role}; the verdict is on the right.", title="Assign")


def _assign_role(directory: Path, role: str) -> Callable[[ConfigDocument], str]:
    def change(document: ConfigDocument) -> str:
        from tui.core.assignment import add_model, set_drafter_model, set_verifier_model

        name = add_model(document, directory)
        (set_verifier_model if role == "verifier" else set_drafter_model)(document, name)
        return name

    return change
