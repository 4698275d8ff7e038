"""Getting around: number keys, the mouse on the mode bar, and the command palette."""

from pathlib import Path

import pytest

from tests.tui.helpers import LOCAL_TOML, make_app, wait_for_text, wait_until
from tui.screens.dashboard import DashboardScreen
from tui.screens.logs import LogsScreen
from tui.screens.models import ModelsScreen

pytestmark = pytest.mark.anyio


async def test_keys_mouse_and_palette_switch_screens(tmp_path: Path) -> None:
    app = make_app(LOCAL_TOML, tmp_path / "home")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_text(pilot, "all reachable")
        await pilot.press("6")
        await wait_until(pilot, lambda: isinstance(app.screen, LogsScreen), "logs by key")
        await pilot.click("#models")  # the mode bar's tab
        await wait_until(pilot, lambda: isinstance(app.screen, ModelsScreen), "models by mouse")
        await pilot.press("ctrl+p")
        await pilot.press(*"go to dashboard")
        await wait_for_text(pilot, "Show the Dashboard screen")  # the palette found it
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, DashboardScreen), "by palette")
        await wait_for_text(pilot, "store missing")


async def test_the_palette_offers_save_open_apply_and_down(tmp_path: Path) -> None:
    app = make_app(LOCAL_TOML, tmp_path / "home")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for_text(pilot, "all reachable")
        titles = [command.title for command in app.get_system_commands(app.screen)]
        for title in (
            "Save cluster file",
            "Open cluster file…",
            "Apply the deployment",
            "Take the deployment down",
            "Go to Assign",
        ):
            assert title in titles
        await pilot.press("ctrl+p", *"take the deployment down")
        await wait_for_text(pilot, "Stop everything apply started")
        await pilot.press("enter")
        await wait_for_text(pilot, "nothing applied", timeout_s=60)


async def test_digits_go_into_a_field_until_escape_leaves_it(tmp_path: Path) -> None:
    from textual.widgets import Input

    from tui.screens.assign import AssignScreen
    from tui.screens.launch import LaunchScreen

    app = make_app(LOCAL_TOML, tmp_path / "home")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("3")
        await wait_for_text(pilot, "● Fits")
        assert app.focused is app.screen.query_one("#verifier-model")  # in the form at once
        field = app.screen.query_one("#replicas", Input)
        field.focus()
        await pilot.press("end", "2")
        await wait_until(pilot, lambda: field.value.endswith("2"), "the digit typed in")
        assert isinstance(app.screen, AssignScreen)  # "2" was text, not the Models key
        await pilot.press("escape", "4")
        await wait_until(pilot, lambda: isinstance(app.screen, LaunchScreen), "launch by key")
