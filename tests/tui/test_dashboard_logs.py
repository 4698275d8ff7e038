"""Pilot tests of the Dashboard and Logs screens on a real store and real log files: figures
that change as the writer writes, and a screen that stays live with the store missing, held by
a writer in another process, or locked out entirely."""

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from db import Store, WriteBatch
from tests.specd.specd_process import SpecdProcess
from tests.tui.conftest import specd_cluster
from tests.tui.helpers import (
    LOCAL_TOML,
    fill_store,
    make_app,
    sample,
    screen_text,
    wait_for_text,
    wait_until,
)
from tui.app import SpecctlApp
from tui.core.launch import WATCH_LOG_NAME

pytestmark = pytest.mark.anyio
HOLDER = Path(__file__).with_name("store_holder.py")


@contextmanager
def store_held(path: Path, mode: str) -> Iterator[None]:
    """Another process holds the store's lock (`immediate` or `exclusive`) meanwhile."""
    holder = subprocess.Popen(
        [sys.executable, str(HOLDER), str(path), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)


def write_sample(path: Path, deployment_id: int, tokens_per_s: float, rate: float) -> None:
    with Store.open(path, role="writer") as store:
        row = sample(deployment_id, time.time(), tokens_per_s=tokens_per_s, acceptance_rate=rate)
        store.write(WriteBatch(metric_samples=[row]))


async def test_the_dashboard_shows_the_store_and_follows_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    deployment_id = fill_store(home / "specctl.db", num_seconds=30)
    app = make_app(LOCAL_TOML, home, dashboard_refresh_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("5")
        text = await wait_for_text(pilot, "local-demo", "running", "Tokens/s  130.0")
        for needle in (
            "Acceptance rate  62%",
            "accepted per round 3.10",
            "k in use 4.0",
            "batch 3",
            "TTFT p50/p99 35/80 ms",
            " 1 ████",
            "90%",
            "spark gpu0",
            "81%",
            "cmpl-0002",
            "50/80",
        ):
            assert needle in text, needle
        write_sample(home / "specctl.db", deployment_id, 222.5, 0.81)
        await wait_for_text(pilot, "Tokens/s  222.5", "Acceptance rate  81%")


async def test_a_missing_store_is_said_and_found_when_it_appears(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    app = make_app(LOCAL_TOML, home, dashboard_refresh_s=0.2)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("5")
        await wait_for_text(pilot, "store missing", "specctl.db: no")
        fill_store(home / "specctl.db", num_seconds=5)
        await wait_for_text(pilot, "local-demo", "Tokens/s  105.0")


@pytest.mark.parametrize("mode", ["immediate", "exclusive"])
async def test_a_store_held_by_another_process_never_freezes_the_screen(
    tmp_path: Path, mode: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    fill_store(home / "specctl.db", num_seconds=10)
    app = make_app(LOCAL_TOML, home, dashboard_refresh_s=0.2)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("5")
        await wait_for_text(pilot, "Tokens/s  110.0")
        dashboard = app.screen
        await pilot.press("1")  # the dashboard pauses while hidden
        await pilot.pause(0.5)
        dashboard._reader.close()  # type: ignore[attr-defined]  # an exclusive lock needs no reader open
        with store_held(home / "specctl.db", mode):
            started = time.monotonic()
            await pilot.press("5")
            if mode == "exclusive":  # readers are locked out: said, the last figures kept
                await wait_for_text(pilot, "store busy", "Tokens/s  110.0")
            else:  # WAL: a writer's lock does not stop readers
                await pilot.pause(1.0)
                assert "Tokens/s  110.0" in screen_text(app) and "busy" not in screen_text(app)
            await pilot.press("1")  # the UI answers while the store is held
            await wait_for_text(pilot, "verifier-node")
            await pilot.press("5")
            await wait_for_text(pilot, "Tokens/s  110.0")
            assert time.monotonic() - started < 15.0  # a bound on freezing, not a speed claim
        await wait_until(pilot, lambda: "busy" not in screen_text(app), "store free again")


def _logs_home(tmp_path: Path) -> tuple[Path, SpecctlApp]:
    """A home with no log yet, and an app on it whose Logs screen looks every 0.2 s."""
    home = tmp_path / "home"
    home.mkdir()
    return home, make_app(LOCAL_TOML, home, logs_refresh_s=0.2)


def _append(path: Path, line: str) -> None:
    with path.open("a") as log:
        log.write(line + "\n")


async def test_the_server_log_is_followed_live(tmp_path: Path) -> None:
    home, app = _logs_home(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("6")
        await wait_for_text(pilot, "no log yet")
        (home / "server.log").write_text("INFO serving on 127.0.0.1:8000\n")
        await wait_for_text(pilot, "INFO serving on 127.0.0.1:8000", "1 line(s), following")
        _append(home / "server.log", "INFO request cmpl-1 done")
        await wait_for_text(pilot, "INFO request cmpl-1 done", "2 line(s)")
        await pilot.press("c")
        await wait_until(pilot, lambda: "cmpl-1" not in screen_text(app), "cleared")


async def test_the_log_of_a_watch_started_here_is_a_source_once_it_exists(tmp_path: Path) -> None:
    home, app = _logs_home(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("6")
        # (two needles: where the path wraps, the list's border falls between the two)
        await wait_for_text(pilot, "server.log", ": no log yet")
        assert "tui-watch.log" not in screen_text(app)
        (home / WATCH_LOG_NAME).write_text("09:00:01 watch started: looking every 30 s\n")
        await wait_for_text(pilot, "tui-watch.log")
        await pilot.click("#log-sources", offset=(2, 1))  # the second source
        await wait_for_text(
            pilot, "09:00:01 watch started: looking every 30 s", "tui-watch.log: 1 line(s)"
        )
        _append(home / WATCH_LOG_NAME, "09:00:41 watch done: repaired (next look in 60 s)")
        await wait_for_text(pilot, "watch done: repaired", "tui-watch.log: 2 line(s)")


async def test_a_specd_log_and_a_refused_one(
    tmp_path: Path, specd: SpecdProcess, wrong_token_file: Path
) -> None:
    good = specd_cluster(tmp_path, f"127.0.0.1:{specd.port}", specd.token_file)
    app = make_app(good, tmp_path / "home", logs_refresh_s=0.3, probe_timeout_s=5.0)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("6")
        await wait_for_text(pilot, "gpu-box (specd)")
        await pilot.click("#log-sources", offset=(2, 1))  # the second source, by mouse
        await wait_for_text(pilot, "gpu-box's specd log", "specd")
    (tmp_path / "wrong").mkdir()
    wrong = specd_cluster(tmp_path / "wrong", f"127.0.0.1:{specd.port}", wrong_token_file)
    app = make_app(wrong, tmp_path / "home", logs_refresh_s=0.3, probe_timeout_s=5.0)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("6")
        await wait_for_text(pilot, "gpu-box (specd)")
        await pilot.click("#log-sources", offset=(2, 1))
        await wait_for_text(pilot, "refused the cluster token")
