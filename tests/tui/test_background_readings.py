"""Background readings of one kind never pile up, and the newest request is the one served."""

import asyncio
import threading
from pathlib import Path

import pytest
from textual.worker import Worker, WorkerState

from tests.tui.helpers import LOCAL_TOML, make_app, wait_until
from tui.screens.base import SpecctlScreen

pytestmark = pytest.mark.anyio

WAIT_S = 20.0  # a bound on a worker thread under load, not a speed claim


def _reading(screen: SpecctlScreen, name: str, ran: list[str], gate: threading.Event) -> Worker:
    def read() -> None:
        if not gate.wait(WAIT_S):
            raise TimeoutError(f"reading {name}: its gate never opened")
        ran.append(name)

    return screen.run_worker(read, thread=True, group="test-reading")


async def test_a_request_made_after_a_reading_ended_is_served_not_an_older_one(
    tmp_path: Path,
) -> None:
    """A runs; B is requested meanwhile (pending); A ends, but before its end is handled C is
    requested and starts at once. B is older than C: it must never run after C."""
    app = make_app(LOCAL_TOML, tmp_path / "home")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, SpecctlScreen)
        ran: list[str] = []
        gates = {name: threading.Event() for name in "ABC"}
        start = {name: (lambda n=name: _reading(screen, n, ran, gates[n])) for name in "ABC"}
        screen.read_in_background("r", start["A"])
        screen.read_in_background("r", start["B"])  # A runs: B waits
        assert ran == []
        a = screen._readers["r"]
        served = asyncio.Event()

        async def request_c_before_a_ends_is_handled() -> None:
            # runs in the screen's own message loop: A's StateChanged, posted to the screen
            # when A ends, waits in its queue until this returns
            gates["A"].set()
            while a.state is not WorkerState.SUCCESS:
                await asyncio.sleep(0.01)
            screen.read_in_background("r", start["C"])  # A is finished: C starts at once
            served.set()

        screen.call_later(request_c_before_a_ends_is_handled)
        await asyncio.wait_for(served.wait(), WAIT_S)
        gates["C"].set()
        gates["B"].set()
        await wait_until(pilot, lambda: "C" in ran, "reading C ran")
        await pilot.pause(0.3)  # A's and C's ends handled: nothing else may start
        assert ran == ["A", "C"]


async def test_requests_while_one_runs_coalesce_into_the_newest(tmp_path: Path) -> None:
    app = make_app(LOCAL_TOML, tmp_path / "home")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, SpecctlScreen)
        ran: list[str] = []
        gates = {name: threading.Event() for name in "ABC"}
        gates["B"].set()
        gates["C"].set()
        start = {name: (lambda n=name: _reading(screen, n, ran, gates[n])) for name in "ABC"}
        for name in "ABC":
            screen.read_in_background("r", start[name])
        gates["A"].set()
        await wait_until(pilot, lambda: "C" in ran, "the newest request ran")
        await pilot.pause(0.3)
        assert ran == ["A", "C"]  # B was superseded by C before A ended
