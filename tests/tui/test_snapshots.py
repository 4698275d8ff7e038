"""Snapshots (pytest-textual-snapshot) of the six screens at 80x24 and 160x48, on content
that does not change from run to run: two specd nodes on closed ports with declared hardware,
the bundled models, a store and a log written by the test. Update after a deliberate change
with `pytest tests/tui/test_snapshots.py --snapshot-update`, and look at the report."""

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from tests.tui.helpers import (
    EXAMPLE_MODELS,
    LOCAL_TOML,
    REPO,
    fill_store,
    make_app,
    screen_text,
    wait_for_text,
    write_remote_pair,
)
from tui.app import SpecctlApp

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]
NEVER_S = 3600.0  # no second reading during a snapshot


def quiet_app(config: Path, home: Path, **overrides: Any) -> SpecctlApp:
    app = make_app(
        config,
        home,
        nodes_refresh_s=NEVER_S,
        dashboard_refresh_s=NEVER_S,
        logs_refresh_s=NEVER_S,
        **overrides,
    )
    return app


async def settled(pilot: Pilot, timeout_s: float = 10.0) -> None:
    """Wait until the screen stops changing (a table's header catches up with its rows a
    refresh after them; on a loaded machine that can be later than a fixed pause)."""
    deadline = time.monotonic() + timeout_s
    previous = screen_text(pilot.app)
    while time.monotonic() < deadline:
        await pilot.pause(0.3)
        current = screen_text(pilot.app)
        if current == previous:
            return
        previous = current


def showing(key: str, *needles: str) -> Callable[[Pilot], Awaitable[None]]:
    async def run_before(pilot: Pilot) -> None:
        await pilot.press(key)
        await wait_for_text(pilot, *needles)
        for field in pilot.app.screen.query(Input):
            field.cursor_blink = False
        await settled(pilot)

    return run_before


@pytest.fixture
def remote_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # paths on screen are shown relative to the current directory
    return write_remote_pair(tmp_path)


class TestNodes:
    @pytest.mark.parametrize("size", SIZES)
    def test_unreachable_nodes(self, snap_compare: Any, remote_pair: Path, size: Any) -> None:
        app = quiet_app(remote_pair, remote_pair.parent / "home")
        run_before = showing("1", "2 unreachable", "declared in the cluster file")
        assert snap_compare(app, terminal_size=size, run_before=run_before)


class TestModels:
    @pytest.mark.parametrize("size", SIZES)
    def test_catalog(
        self, snap_compare: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: Any
    ) -> None:
        monkeypatch.chdir(REPO)
        app = quiet_app(LOCAL_TOML, tmp_path / "home", model_dirs=(EXAMPLE_MODELS,))
        run_before = showing("2", "4 model(s) found", "packaging/demo-models/target")
        assert snap_compare(app, terminal_size=size, run_before=run_before)


class TestAssign:
    @pytest.mark.parametrize("size", SIZES)
    def test_verdict(self, snap_compare: Any, remote_pair: Path, size: Any) -> None:
        app = quiet_app(remote_pair, remote_pair.parent / "home")
        run_before = showing("3", "● Fits", "llama-70b")
        assert snap_compare(app, terminal_size=size, run_before=run_before)


class TestLaunch:
    @pytest.mark.parametrize("size", SIZES)
    def test_nothing_deployed(self, snap_compare: Any, remote_pair: Path, size: Any) -> None:
        app = quiet_app(remote_pair, remote_pair.parent / "home")
        assert snap_compare(app, terminal_size=size, run_before=showing("4", "nothing deployed"))


class TestDashboard:
    @pytest.mark.parametrize("size", SIZES)
    def test_live_figures(self, snap_compare: Any, remote_pair: Path, size: Any) -> None:
        home = remote_pair.parent / "home"
        home.mkdir()
        fill_store(home / "specctl.db", num_seconds=60)
        app = quiet_app(remote_pair, home)
        run_before = showing("5", "local-demo", "Tokens/s  160.0", "cmpl-0002")
        assert snap_compare(app, terminal_size=size, run_before=run_before)


class TestLogs:
    @pytest.mark.parametrize("size", SIZES)
    def test_server_log(self, snap_compare: Any, remote_pair: Path, size: Any) -> None:
        home = remote_pair.parent / "home"
        home.mkdir()
        lines = [
            f"INFO specctl.server: request cmpl-{i:04d} finished: 64 tokens" for i in range(30)
        ]
        (home / "server.log").write_text("\n".join(lines) + "\n")
        app = quiet_app(remote_pair, home)
        run_before = showing("6", "cmpl-0029", "30 line(s), following")
        assert snap_compare(app, terminal_size=size, run_before=run_before)
