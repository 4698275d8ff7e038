"""Pilot tests of the Launch screen driving the real `apply`, `apply --watch` and `down` (in
their child process): steps shown as they happen, failures said plainly, a watch that outlives
the TUI, nothing left running."""

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from specctl.apply.watch_record import live_watch
from specctl.cluster.local_cluster import LocalCluster
from specctl.cluster.local_nodes import LocalNodeSpec
from specctl.home import SpecctlHome
from tests.control.test_watch_record import watch_process
from tests.specd.specd_process import free_port
from tests.tui.helpers import LOCAL_TOML, REPO, make_app, screen_text, wait_for_text, wait_until
from tui.core.launch import (
    WATCH_LOG_MAX_BYTES,
    WATCH_LOG_NAME,
    rotate_watch_log,
    stop_watch,
    take_down_home,
)
from tui.core.status import read_deployment_status

pytestmark = pytest.mark.anyio
WATCH_INTERVAL_S = 45.0  # --watch-interval (30 s by default)
DEMO = LOCAL_TOML.parents[1] / "packaging" / "demo-models"
APPLY_WAIT_S = 300.0  # Ray nodes and shard loading on a loaded 2-core machine: a bound only


def local_cluster_file(directory: Path, draft_dir: Path = DEMO / "draft", **edits: str) -> Path:
    text = LOCAL_TOML.read_text()
    text = text.replace('"../packaging/demo-models/target"', f'"{DEMO / "target"}"')
    text = text.replace('"../packaging/demo-models/draft"', f'"{draft_dir}"')
    text = text.replace("port = 8000", f"port = {free_port()}")
    for old, new in edits.items():
        text = text.replace(old, new)
    path = directory / "cluster.toml"
    path.write_text(text)
    return path


class IgnoreEvents:
    def step(self, name: str, state: str, detail: str = "") -> None: ...

    def loading(self, shard_id: str, node: str, loaded_bytes: int, total_bytes: int) -> None: ...


def stop_everything(root: Path) -> None:
    """Stop a watch, let an apply still running end, take down what it recorded (the real
    `down`), then stop local Ray nodes a failed apply left unrecorded."""
    stopped = stop_watch(SpecctlHome(root), wait_s=APPLY_WAIT_S)
    assert stopped.is_ok, stopped.message
    deadline = time.monotonic() + APPLY_WAIT_S
    while launch_children(root) and time.monotonic() < deadline:
        time.sleep(0.5)
    specctl_home = SpecctlHome(root)
    outcome = take_down_home(specctl_home, IgnoreEvents(), lambda: False)
    if specctl_home.ray_root.exists():
        specs = [LocalNodeSpec("verifier-node"), LocalNodeSpec("drafter-node")]
        LocalCluster(specs, specctl_home.ray_root, specctl_home.token_file).stop()
        shutil.rmtree(specctl_home.ray_root, ignore_errors=True)
    assert outcome.is_ok, outcome.message


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """A fresh $SPECCTL_HOME; whatever a test leaves running is stopped afterwards."""
    root = tmp_path / "home"
    yield root
    stop_everything(root)


async def test_nothing_deployed_and_a_plan_that_does_not_fit(tmp_path: Path, home: Path) -> None:
    squeezed = local_cluster_file(
        tmp_path,
        **{'specd = "local"              #': 'specd = "local"\nmemory_utilization = 0.0001 #'},
    )
    app = make_app(squeezed, home)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("4")
        await wait_for_text(pilot, "nothing deployed")
        await pilot.press("a")
        text = await wait_for_text(
            pilot, "Apply failed: the plan does not fit", "✗ failed", timeout_s=APPLY_WAIT_S
        )
        assert "validate" in text and "✓ done" in text
    assert not SpecctlHome(home).ray_root.exists()  # refused before any node started
    assert read_deployment_status(SpecctlHome(home)).deployment is None


async def test_down_with_nothing_deployed_is_fine(tmp_path: Path, home: Path) -> None:
    app = make_app(local_cluster_file(tmp_path), home)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("4", "d")
        await wait_for_text(pilot, "= unchanged", "nothing applied", "Everything apply started is")


async def test_a_deployment_that_fails_to_load_is_said_and_taken_down(
    tmp_path: Path, home: Path
) -> None:
    broken = tmp_path / "broken-draft"
    shutil.copytree(DEMO / "draft", broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    app = make_app(local_cluster_file(tmp_path, draft_dir=broken), home)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("4", "a")
        text = await wait_for_text(pilot, "Apply failed:", timeout_s=APPLY_WAIT_S)
        assert "ray nodes" in text and "✗ stopped" in text, text  # the step it stopped in
        await pilot.press("d")
        await wait_for_text(pilot, "Down", "nothing deployed", timeout_s=APPLY_WAIT_S)
    # apply records the nodes it started before the shards load, so down stops them all
    assert ray_processes(SpecctlHome(home)) == []


def ray_processes(home: SpecctlHome) -> list[int]:
    """Live processes of the local Ray nodes apply started for `home` (their command lines
    name the node directories under its ray_root)."""
    marker = str(home.ray_root).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def launch_children(home: Path) -> list[int]:
    """Live `tui.core.launch_child` processes working on `home`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if b"tui.core.launch_child" in cmdline and f"SPECCTL_HOME={home}".encode() in environ:
            found.append(int(entry.name))
    return found


async def test_quitting_during_apply_returns_at_once_and_apply_goes_on(
    tmp_path: Path, home: Path
) -> None:
    app = make_app(local_cluster_file(tmp_path), home)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("4", "a")
        await wait_for_text(pilot, "ray nodes", timeout_s=APPLY_WAIT_S)
        started = time.monotonic()
        app.exit()
    assert time.monotonic() - started < 10.0  # not held until apply ends; a bound only
    children = launch_children(home)
    assert children, "the apply child should still be running"
    deadline = time.monotonic() + APPLY_WAIT_S
    while launch_children(home) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not launch_children(home)  # it ran to its end, events to a closed pipe and all


async def test_a_watch_started_here_outlives_the_tui_and_is_stopped_from_it(
    tmp_path: Path, home: Path
) -> None:
    """w applies the file with each step shown, then leaves a watch keeping it running: the
    TUI quits, the watch goes on (its steps in its log, not in a pipe nobody reads); a TUI
    started again shows it, and w stops it, the deployment still serving."""
    config = local_cluster_file(tmp_path)
    specctl_home = SpecctlHome(home)
    app = make_app(config, home, watch_interval_s=WATCH_INTERVAL_S)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("4")
        await wait_for_text(pilot, "nothing deployed", "w: apply, then keep it running")
        await pilot.press("w")
        text = await wait_for_text(
            pilot, "Endpoint ready", "Kept running by a watch: pid", timeout_s=APPLY_WAIT_S
        )
        assert "ray nodes" in text and "✓ done" in text, text
        await wait_for_text(pilot, "kept running by a watch: pid", "Stop watch")
    watching = live_watch(specctl_home)
    assert watching is not None and watching.interval_s == WATCH_INTERVAL_S
    assert watching.config_path == str(config)
    log = home / WATCH_LOG_NAME
    deadline = time.monotonic() + 60
    while f"watch started: looking every {WATCH_INTERVAL_S:g} s" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    assert f"(w on the TUI's Launch screen, or kill {watching.pid}, stops it)" in log.read_text()
    still = live_watch(specctl_home)
    assert still is not None and still.pid == watching.pid, "the watch ended with the TUI"
    assert read_deployment_status(specctl_home).is_server_healthy

    app = make_app(config, home)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("4")
        await wait_for_text(pilot, f"kept running by a watch: pid {watching.pid}", "Stop watch")
        await pilot.press("w")
        await wait_for_text(
            pilot, f"The watch (pid {watching.pid}) stopped. The deployment keeps running."
        )
        await wait_until(
            pilot, lambda: "kept running by a watch" not in screen_text(app), "the watch unshown"
        )
        assert "Stop watch" not in screen_text(app)
        assert live_watch(specctl_home) is None
        deadline = time.monotonic() + 30  # reaped by the first app's thread, in this process
        while Path(f"/proc/{watching.pid}").exists():
            assert time.monotonic() < deadline, f"the watch {watching.pid} still runs"
            time.sleep(0.2)
        assert "watch done: stopped watching; the deployment is left as it is" in log.read_text()
        status = read_deployment_status(specctl_home)
        assert status.is_server_healthy and status.watch is None

        # a watch again (nothing to change), then down: the watch is stopped first
        await pilot.press("w")
        await wait_for_text(pilot, "Kept running by a watch: pid", timeout_s=APPLY_WAIT_S)
        second = live_watch(specctl_home)
        assert second is not None and second.pid != watching.pid
        await wait_for_text(pilot, "Stop watch")
        await pilot.press("d")
        text = await wait_for_text(
            pilot, "Everything apply started is stopped", timeout_s=APPLY_WAIT_S
        )
        assert f"the watch (pid {second.pid}) stopped" in text, text
    assert live_watch(specctl_home) is None
    assert read_deployment_status(specctl_home).deployment is None
    assert ray_processes(specctl_home) == []


async def test_a_watch_in_its_first_apply_is_shown_and_stopped_with_nothing_applied(
    tmp_path: Path,
) -> None:
    """A watch (a real process holding the home as `apply --watch` does) while nothing is
    applied yet: Launch shows it, and w stops it rather than starting another."""
    home = tmp_path / "home"
    with watch_process(home, "--watch", "10") as watching:
        app = make_app(LOCAL_TOML, home)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("4")
            await wait_for_text(
                pilot, "nothing deployed", f"kept running by a watch: pid {watching.pid}"
            )
            await wait_for_text(pilot, "Stop watch")
            await pilot.press("w")
            await wait_for_text(pilot, f"The watch (pid {watching.pid}) stopped.")
            assert watching.wait(timeout=30) == -15
            await wait_until(
                pilot, lambda: "Stop watch" not in screen_text(app), "the watch unshown"
            )


async def test_stopping_a_watch_where_none_runs_says_so(tmp_path: Path) -> None:
    outcome = stop_watch(SpecctlHome(tmp_path / "home"))
    assert outcome.is_ok and outcome.message == "No watch keeps this deployment running."


def test_the_watch_child_refuses_a_wrong_interval(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tui.core.launch_child", "watch", str(LOCAL_TOML), "0.1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={"SPECCTL_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2, done.stderr
    usage = "usage: apply CLUSTER.toml | watch CLUSTER.toml SECONDS (0.5 to 86400) | down"
    assert usage in done.stdout
    assert not (tmp_path / "home").exists()  # nothing held, nothing written


def test_a_long_watch_log_is_moved_aside_by_the_next_watch_unless_one_runs(
    tmp_path: Path,
) -> None:
    """The log a watch started here appends to stays bounded: past its size, the next watch
    moves it to `.1` (dropping the one before), never while a watch writes to it."""
    home = SpecctlHome(tmp_path)
    log, kept = tmp_path / WATCH_LOG_NAME, tmp_path / (WATCH_LOG_NAME + ".1")
    rotate_watch_log(home)  # none yet: nothing to do, nothing raised
    assert not log.exists() and not kept.exists()
    log.write_bytes(b"x" * WATCH_LOG_MAX_BYTES)  # at the size: kept where it is
    rotate_watch_log(home)
    assert log.stat().st_size == WATCH_LOG_MAX_BYTES and not kept.exists()
    kept.write_text("an older log\n")
    with log.open("a") as more:
        more.write("the last line\n")
    with watch_process(tmp_path, "--watch", "10"):  # a watch runs: its log stays
        rotate_watch_log(home)
        assert log.exists() and kept.read_text() == "an older log\n"
    rotate_watch_log(home)
    assert not log.exists()
    assert kept.read_text().endswith("the last line\n")
