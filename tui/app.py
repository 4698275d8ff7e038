"""The specctl TUI: one app, six screens (Textual modes), the cluster file they share.

Start-up shows the first frame before anything heavy is imported: each screen's module is
imported when the screen is first shown, and the cluster file, the planner and the store are
read by workers after the first frame.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.reactive import reactive
from textual.screen import Screen

from tui import formatting as fmt
from tui.widgets.mode_bar import MODE_TABS

if TYPE_CHECKING:
    from tui.core.session import ConfigSession
    from tui.core.settings import TuiSettings
    from tui.core.verdict import FactsCache


def _screen(module: str, name: str) -> Callable[[], Screen]:
    def make() -> Screen:
        from importlib import import_module

        return getattr(import_module(f"tui.screens.{module}"), name)()

    return make


class SpecctlApp(App[None]):
    TITLE = "specctl"
    CSS_PATH = "specctl.tcss"
    MODES: ClassVar[dict[str, str | Callable[[], Screen]]] = {
        "nodes": _screen("nodes", "NodesScreen"),
        "models": _screen("models", "ModelsScreen"),
        "assign": _screen("assign", "AssignScreen"),
        "launch": _screen("launch", "LaunchScreen"),
        "dashboard": _screen("dashboard", "DashboardScreen"),
        "logs": _screen("logs", "LogsScreen"),
    }
    DEFAULT_MODE = "nodes"
    BINDINGS: ClassVar[list[BindingType]] = [
        *(
            Binding(str(n), f"switch_mode('{mode}')", title, show=False)
            for n, (mode, title) in enumerate(MODE_TABS, 1)
        ),
        Binding("ctrl+s", "save", "Save"),
        Binding("ctrl+o", "open_file", "Open"),
        Binding("ctrl+q", "quit", "Quit"),
    ]

    session_revision: reactive[int] = reactive(0, init=False)
    """Bumped whenever the cluster file is loaded, edited or saved."""

    deployment_revision: reactive[int] = reactive(0, init=False)
    """Bumped whenever apply or down finishes."""

    def __init__(self, settings: TuiSettings) -> None:
        super().__init__()
        self.settings = settings
        self.session: ConfigSession | None = None
        self.session_problem: str | None = None  # why the file could not be opened
        self._facts_cache: FactsCache | None = None

    def on_mount(self) -> None:
        self.open_config(self.settings.config_path, self.settings.save_path)

    # ---- the cluster file ----

    @work(thread=True, exclusive=True, group="session")
    def open_config(self, path: Path, save_path: Path) -> None:
        from specctl.config.errors import ConfigError
        from tui.core.session import ConfigSession

        try:
            session = ConfigSession.open(path, save_path)
        except ConfigError as error:
            self.call_from_thread(self._config_failed, str(error))
            return
        self.call_from_thread(self._config_opened, session)

    def _config_opened(self, session: ConfigSession) -> None:
        self.session, self.session_problem = session, None
        self.session_edited()

    def _config_failed(self, problem: str) -> None:
        self.session_problem = problem
        self.notify(
            problem,
            title="Cannot open the cluster file",
            severity="error",
            timeout=10,
            markup=False,
        )
        self.session_edited()

    def session_edited(self) -> None:
        self.session_revision += 1

    def action_save(self) -> None:
        if self.session is None:
            self.notify("No cluster file is open.", severity="warning")
            return
        self.save_config()

    @work(thread=True, exclusive=True, group="save")
    def save_config(self) -> None:
        from specctl.config.errors import ConfigError

        session = self.session
        assert session is not None
        try:
            path, unchecked = session.save_checked()
        except ConfigError as error:
            self.call_from_thread(self._saved, None, f"Not saved: the file is invalid.\n{error}")
            return
        except OSError as error:
            self.call_from_thread(self._saved, None, f"Not saved: {error}")
            return
        self.call_from_thread(self._saved, path, None, unchecked)

    def _saved(self, path: Path | None, problem: str | None, unchecked: str | None = None) -> None:
        if problem is not None:
            self.notify(problem, title="Save", severity="error", timeout=10, markup=False)
            return
        saved = f"Saved {fmt.path(path)}" if path else "Saved"
        if unchecked is not None:
            saved += f", not all checked: its nodes did not answer.\n{unchecked}"
            self.notify(saved, title="Save", severity="warning", timeout=10, markup=False)
        else:
            self.notify(saved, title="Save")
        self.session_edited()

    def action_open_file(self) -> None:
        from tui.screens.open_file import OpenFileScreen

        current = self.session.path if self.session else self.settings.config_path
        self.push_screen(OpenFileScreen(current), self._open_chosen)

    def _open_chosen(self, path: Path | None) -> None:
        if path is not None:
            self.open_config(path, path)

    # ---- shared by the screens ----

    def facts_cache(self) -> FactsCache:
        """Node facts for the planner, shared by every verdict (called from workers)."""
        if self._facts_cache is None:
            from tui.core.verdict import FactsCache

            self._facts_cache = FactsCache(self.settings.probe_timeout_s)
        return self._facts_cache

    def deployment_changed(self) -> None:
        """Apply or down finished: screens showing the deployment look again."""
        self.deployment_revision += 1

    # ---- the command palette ----

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for mode, title in MODE_TABS:
            name = title.split(" ", 1)[1]
            yield SystemCommand(f"Go to {name}", f"Show the {name} screen", self._go_to(mode))
        yield SystemCommand("Save cluster file", "Write the edited cluster.toml", self.action_save)
        yield SystemCommand(
            "Open cluster file…", "Load another cluster.toml", self.action_open_file
        )
        yield SystemCommand(
            "Apply the deployment", "Launch what the file describes", self._launch("apply")
        )
        yield SystemCommand(
            "Take the deployment down", "Stop everything apply started", self._launch("down")
        )

    def _go_to(self, mode: str) -> Callable[[], None]:
        return lambda: self.switch_mode(mode)  # type: ignore[return-value]

    def _launch(self, action: str) -> Callable[[], None]:
        def run() -> None:
            self.switch_mode("launch")
            self.call_later(lambda: self.screen.run_action(action))

        return run
