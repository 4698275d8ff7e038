"""The whole way through, on a real local deployment of the demo pair:

- in Pilot: assign (k and the port through the form) → save (the file keeps its comments) →
  launch (apply, every step shown) → requests through the endpoint → down;
- in a real terminal (tmux): `specctl examples/local.toml`, launch, requests through the
  endpoint, and the Dashboard's numbers change on the captured screen.
"""

import itertools
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specctl.home import SpecctlHome
from tests.specd.specd_process import free_port
from tests.tui.helpers import LOCAL_TOML, make_app, wait_for_text, wait_until
from tests.tui.terminal import TmuxTerminal
from tests.tui.test_launch import APPLY_WAIT_S, stop_everything
from tui.core.status import read_deployment_status

pytestmark = pytest.mark.slow


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """A fresh $SPECCTL_HOME, taken down afterwards whatever the test did."""
    root = tmp_path / "home"
    yield root
    stop_everything(root)


def complete(endpoint: str, prompt: str) -> dict:  # type: ignore[type-arg]
    body = {"model": "demo-target", "prompt": prompt, "max_tokens": 24, "temperature": 0}
    response = httpx.post(f"{endpoint}/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


async def retype(pilot, widget_id: str, text: str) -> None:  # type: ignore[no-untyped-def]
    from textual.widgets import Input

    field = pilot.app.screen.query_one(f"#{widget_id}", Input)
    field.focus()
    await pilot.press("end", *["backspace"] * len(field.value), *text)


@pytest.mark.anyio
async def test_assign_save_launch_in_pilot(tmp_path: Path, home: Path) -> None:
    port = free_port()
    save_path = tmp_path / "cluster.toml"
    app = make_app(LOCAL_TOML, home, save_path=save_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        await wait_for_text(pilot, "● Fits")
        await retype(pilot, "k", "3")
        await retype(pilot, "port", str(port))
        await wait_for_text(pilot, f"127.0.0.1:{port}/v1", "k = 3 drafted")
        await pilot.press("ctrl+s")
        await wait_until(pilot, save_path.exists, "saved")
        saved = save_path.read_text()
        assert f"port = {port}" in saved and "k = 3" in saved
        assert "# a Ray node on this machine, no specd needed" in saved  # comments kept
        assert LOCAL_TOML.read_text() != saved  # the shipped example is untouched ...
        assert "k = 4" in LOCAL_TOML.read_text()  # ... and still as shipped
        await pilot.press("escape", "4", "a")  # out of the port field, then Launch's keys
        text = await wait_for_text(pilot, "Endpoint ready", timeout_s=APPLY_WAIT_S)
        for step in ("validate", "plan", "ray nodes", "shards", "server"):
            assert step in text, step
        endpoint = f"http://127.0.0.1:{port}/v1"
        assert complete(endpoint, "def parse_args(argv):")["choices"][0]["text"]
        status = read_deployment_status(SpecctlHome(home))
        roles = {role: node for _, role, node in status.shards}
        assert roles == {"verifier": "verifier-node", "drafter": "drafter-node"}
        await pilot.press("d")
        await wait_for_text(pilot, "Everything apply started is stopped", timeout_s=APPLY_WAIT_S)
    assert read_deployment_status(SpecctlHome(home)).deployment is None


def dashboard_figure(screen: str, title: str) -> str:
    for line in screen.splitlines():
        if title in line:
            return line.split(title, 1)[1].split()[0]
    raise AssertionError(f"{title} not on screen:\n{screen}")


PROMPTS = ("def parse_args(argv):", "import os\n", "class Config:")


class SteadyLoad:
    """Requests one after another through the endpoint from a thread, until the block ends:
    the serving process's samples are taken every second, so a figure can be caught moving."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.ids: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for prompt in itertools.cycle(PROMPTS):
            if self._stop.is_set():
                return
            try:
                self.ids.append(complete(self.endpoint, prompt)["id"])
            except (AssertionError, httpx.HTTPError) as error:
                self.errors.append(str(error))
                return

    def __enter__(self) -> "SteadyLoad":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=150)  # one request's bound, with room


def is_positive(figure: str) -> bool:
    try:
        return float(figure) > 0
    except ValueError:
        return False


def wait_for_the_dashboard_to_move(terminal: TmuxTerminal, before: str, load: SteadyLoad) -> str:
    """The captured screen once Tokens/s is above zero and differs from `before`, the
    acceptance rate is a percentage, and one of our requests is in the table (its id's end)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not load.errors:
        after = terminal.screen()
        tokens = dashboard_figure(after, "Tokens/s")
        moved = is_positive(tokens) and tokens != dashboard_figure(before, "Tokens/s")
        rate_shown = dashboard_figure(after, "Acceptance rate").endswith("%")
        ours = any(request_id[-10:] in after for request_id in list(load.ids))
        if moved and rate_shown and ours:
            return after
        time.sleep(0.5)
    raise AssertionError(f"the dashboard did not move:\n{before}\n---\n{terminal.screen()}")


def test_specctl_in_a_real_terminal_launches_and_the_dashboard_moves(
    tmp_path: Path, home: Path
) -> None:
    """`specctl examples/local.toml` in tmux: launch, send requests, watch the Dashboard."""
    port = free_port()
    env = {"SPECCTL_HOME": str(home), "TERM": "xterm-256color", "PATH": os.environ["PATH"]}
    command = [sys.executable, "-m", "specctl.cli", str(LOCAL_TOML)]
    terminal = TmuxTerminal(command, tmp_path, env, size=(120, 40))
    try:
        terminal.wait_for("verifier-node", "all reachable")
        terminal.press("3")
        terminal.wait_for("● Fits")
        terminal.press(*["Tab"] * 10)  # verifier, nodes, TP, layers, drafter, node, adaptive,
        terminal.press("End", *["BSpace"] * 4, *str(port))  # k, mode, replicas -> port
        terminal.wait_for(f"127.0.0.1:{port}/v1")
        terminal.press("C-l")  # Assign's Launch: to the Launch screen, and apply
        terminal.wait_for("Endpoint ready", timeout_s=APPLY_WAIT_S)
        assert (tmp_path / "cluster.toml").is_file()  # saved beside us, not over the example
        terminal.press("5")
        before = terminal.wait_for("Tokens/s", "local-demo running")  # the Dashboard
        endpoint = f"http://127.0.0.1:{port}/v1"
        with SteadyLoad(endpoint) as load:
            after = wait_for_the_dashboard_to_move(terminal, before, load)
        assert load.errors == [], load.errors
        assert "local-demo running" in after
        terminal.press("4", "d")
        terminal.wait_for("Everything apply started is stopped", timeout_s=APPLY_WAIT_S)
        terminal.press("C-q")
    finally:
        terminal.close()
    assert read_deployment_status(SpecctlHome(home)).deployment is None
