"""Assign: which model verifies and on which nodes (tensor parallel size, pipeline split), what
drafts and where, how many tokens per round, how many replicas. Every change is written into
the cluster document at once (comments and order kept) and the planner's verdict follows it
live: fits or not, and why. Save writes the file; Open loads another."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from textual import on, work
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.widget import Widget
from textual.widgets import Button, Checkbox, Input, Label, Select, SelectionList, Static
from textual.worker import get_current_worker

from tui import formatting as fmt
from tui.messages import VerdictReady
from tui.screens.base import SpecctlScreen
from tui.widgets.verdict import VerdictPanel

if TYPE_CHECKING:
    from specctl.config.document import ConfigDocument
    from tui.core.assignment import Assignment
    from tui.core.session import ConfigSnapshot

MODE_OPTIONS = [("overlapped", "overlapped"), ("sync", "sync")]
Edit = Callable[["ConfigDocument", Any], bool]


def _field(label: str, widget: Widget, tall: bool = False) -> Horizontal:
    """A labelled row; a label starting with spaces is a detail of the row above it."""
    name = label.strip()
    classes = "sub" if label.startswith(" ") else ""
    return Horizontal(
        Label(name, classes=classes), widget, classes="field -tall" if tall else "field"
    )


class AssignScreen(SpecctlScreen):
    MODE = "assign"
    AUTO_FOCUS = "#verifier-model"  # the form's first field, not its scroll container
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+l", "launch", "Launch"),
        Binding("escape", "leave_field", "Leave field"),  # then 1-6 switch screens again
    ]

    def __init__(self) -> None:
        super().__init__()
        self._own_revision = -1  # the app revision our own last edit produced
        self._options: dict[str, list[tuple[str, str]]] = {}

    def compose_body(self) -> Iterable[Widget]:
        yield Static(id="assign-file", markup=False)
        with Horizontal(id="assign-body"):
            with VerticalScroll(id="assign-form"):
                yield _field(
                    "Verifier",
                    Select([], id="verifier-model", compact=True, prompt="(choose a model)"),
                )
                yield _field("  nodes", SelectionList[str](id="verifier-nodes", compact=True), True)
                yield _field("  TP size", Input(id="tp", compact=True))
                yield _field("  layers/node", Input(id="split", compact=True, placeholder="auto"))
                yield _field(
                    "Drafter",
                    Select([], id="drafter-model", compact=True, prompt="(choose a drafter)"),
                )
                yield _field(
                    "  node", Select([], id="drafter-node", compact=True, prompt="(choose a node)")
                )
                yield _field("Adaptive k", Checkbox("k per round", id="adaptive", compact=True))
                yield _field("k", Input(id="k", compact=True))
                yield _field(
                    "Mode", Select(MODE_OPTIONS, id="mode", compact=True, allow_blank=False)
                )
                yield _field("Replicas", Input(id="replicas", compact=True))
                yield _field("Port", Input(id="port", compact=True))
                yield Static(id="field-error", classes="field-error", markup=False)
                with Horizontal(id="assign-buttons"):
                    yield Button("Save", id="save", compact=True, variant="primary")
                    yield Button("Open…", id="open", compact=True)
                    yield Button("Launch", id="launch", compact=True, variant="success")
            yield VerdictPanel()

    # ---- filling the form from the document ----

    def session_changed(self, revision: int) -> None:
        session = self.specctl.session
        if session is None:
            problem = self.specctl.session_problem
            self.query_one(VerdictPanel).show_text(problem or "Reading the cluster file…")
            return
        self._show_file_line()
        # only a revision newer than our own last edit can hold what the form does not show:
        # a late call for an older one (watchers run after the edits that queued them) would
        # write the document's value back into the field being typed in
        if revision > self._own_revision:
            self._fill(exclude=None)
        self.check_verdict()

    def _show_file_line(self) -> None:
        session = self.specctl.session
        assert session is not None
        text = fmt.path(session.path)
        if session.save_path != session.path:
            text += f" → saves to {fmt.path(session.save_path)}"
        if session.is_dirty:
            text += "  (modified, not saved)"
        self.query_one("#assign-file", Static).update(text)

    def _fill(self, exclude: str | None) -> None:
        from tui.core.assignment import read_assignment

        session = self.specctl.session
        assert session is not None
        with session.lock:
            form = read_assignment(session.document)
        with self.prevent(
            Select.Changed, Input.Changed, Checkbox.Changed, SelectionList.SelectedChanged
        ):
            self._fill_models(form, exclude)
            self._fill_numbers(form, exclude)

    def _fill_models(self, form: Assignment, exclude: str | None) -> None:
        models = [(name, name) for name in form.model_names]
        nodes = [(name, name) for name in form.node_names]
        if exclude != "verifier-model":
            self._set_select("verifier-model", models, form.verifier_model)
        if exclude != "verifier-nodes":
            _set_nodes(self.query_one("#verifier-nodes", SelectionList), form)
        drafters = [*models, ("ngram (prompt lookup)", "ngram")]
        if exclude != "drafter-model":
            self._set_select("drafter-model", drafters, form.drafter_model)
        if exclude != "drafter-node":
            self._set_select("drafter-node", nodes, form.drafter_node)
        self.query_one("#drafter-node", Select).disabled = form.drafter_model == "ngram"

    def _fill_numbers(self, form: Assignment, exclude: str | None) -> None:
        values = {
            "tp": form.tensor_parallel_size,
            "split": form.pipeline_split,
            "k": form.max_k if form.is_adaptive else form.k,
            "replicas": form.replicas,
            "port": form.port,
        }
        for widget_id, value in values.items():
            widget = self.query_one(f"#{widget_id}", Input)
            if widget_id != exclude and widget.value != value:
                widget.value = value
        self.query_one("#adaptive", Checkbox).value = form.is_adaptive
        k_label = self.query_one("#k", Input).parent.query_one(Label)  # type: ignore[union-attr]
        k_label.update("max k" if form.is_adaptive else "k")
        self._set_select("mode", MODE_OPTIONS, form.mode)

    def _set_select(
        self, widget_id: str, options: list[tuple[str, str]], value: str | None
    ) -> None:
        """Give the Select these options (when they changed) and `value` (blank if unknown)."""
        select = self.query_one(f"#{widget_id}", Select)
        if self._options.get(widget_id) != options:
            select.set_options(options)
            self._options[widget_id] = options
        if value is not None and any(v == value for _, v in options):
            select.value = value
        elif widget_id != "mode":  # the mode has no blank: it stays as it was
            select.value = Select.NULL

    # ---- edits ----

    def _edit(self, source: str, edit_name: str, value: object) -> None:
        from tui.core import assignment

        session = self.specctl.session
        if session is None:
            return
        edit: Edit = getattr(assignment, edit_name)
        try:
            session.edit(lambda document: edit(document, value))
        except assignment.FieldInputError as error:
            self.query_one("#field-error", Static).update(str(error))
            if not isinstance(self.query_one(f"#{source}"), Input):
                self._fill(exclude=None)  # a choice refused: show what the file still holds
            return
        self.query_one("#field-error", Static).update("")
        self._own_revision = self.specctl.session_revision + 1
        self._fill(exclude=source)
        self.specctl.session_edited()

    @on(Select.Changed)
    def _select_changed(self, event: Select.Changed) -> None:
        edits = {
            "verifier-model": "set_verifier_model",
            "drafter-model": "set_drafter_model",
            "drafter-node": "set_drafter_node",
            "mode": "set_mode",
        }
        if event.select.id in edits and event.value is not Select.NULL:
            self._edit(event.select.id, edits[event.select.id], event.value)

    @on(SelectionList.SelectedChanged, "#verifier-nodes")
    def _nodes_changed(self, event: SelectionList.SelectedChanged) -> None:
        self._edit("verifier-nodes", "set_verifier_nodes", list(event.selection_list.selected))

    @on(Input.Changed)
    def _input_changed(self, event: Input.Changed) -> None:
        adaptive = self.query_one("#adaptive", Checkbox).value
        edits = {
            "tp": "set_tensor_parallel_size",
            "split": "set_pipeline_split",
            "k": "set_max_k" if adaptive else "set_k",
            "replicas": "set_replicas",
            "port": "set_port",
        }
        if event.input.id in edits:
            self._edit(event.input.id, edits[event.input.id], event.value)

    @on(Checkbox.Changed, "#adaptive")
    def _adaptive_changed(self, event: Checkbox.Changed) -> None:
        self._edit("adaptive", "set_adaptive", event.value)

    # ---- the verdict ----

    def check_verdict(self) -> None:
        session = self.specctl.session
        if session is not None:
            snapshot = session.snapshot()
            self.read_in_background("verdict", lambda: self._judge(snapshot))

    @work(thread=True, group="verdict")
    def _judge(self, snapshot: ConfigSnapshot) -> None:
        from tui.core.verdict import judge

        verdict = judge(snapshot.check(), self.specctl.facts_cache(), snapshot.revision)
        if not get_current_worker().is_cancelled:
            self.post_message(VerdictReady(verdict))

    @on(VerdictReady)
    def _show_verdict(self, message: VerdictReady) -> None:
        self.query_one(VerdictPanel).show(message.verdict)

    # ---- buttons ----

    @on(Button.Pressed, "#save")
    def _save_pressed(self) -> None:
        self.app.run_action("save")

    @on(Button.Pressed, "#open")
    def _open_pressed(self) -> None:
        self.app.run_action("open_file")

    def action_leave_field(self) -> None:
        """Take the focus out of the form: digits typed into a field stay in the field, so
        the screen keys (1-6) work again only once no field has the focus."""
        self.set_focus(None)

    @on(Button.Pressed, "#launch")
    def action_launch(self) -> None:
        self.app.switch_mode("launch")
        self.app.call_later(lambda: self.app.screen.run_action("apply"))


def _set_nodes(selection: SelectionList, form: Assignment) -> None:
    """Verifier nodes in stage order first (selection order is layer order), then the rest."""
    ordered = [*form.verifier_nodes, *(n for n in form.node_names if n not in form.verifier_nodes)]
    if [selection.get_option_at_index(i).value for i in range(selection.option_count)] != ordered:
        selection.clear_options()
        selection.add_options([(name, name) for name in ordered])
    selection.deselect_all()
    for name in form.verifier_nodes:
        if name in form.node_names:
            selection.select(name)
