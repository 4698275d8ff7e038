"""The home's watch: held under an flock for the watch's life, so a second watch is refused
(at the same moment too), a watch that died (killed, however) reads as none, and a damaged
record is none rather than a crash of `status`. The other watch is a real process."""

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from specctl.apply import watch_record
from specctl.apply.down import WatchNotStopped, take_down
from specctl.apply.watch_record import WatchRunning, holding_watch, live_watch, stop_watch
from specctl.commands.apply_view import JsonEvents
from specctl.home import SpecctlHome

REPO = Path(__file__).resolve().parents[2]

# another process's watch of HOME: says so, then holds it until killed
WATCH = """
import sys, time
from pathlib import Path
from specctl.apply.watch_record import holding_watch
from specctl.home import SpecctlHome
with holding_watch(SpecctlHome(Path(sys.argv[1])), 10.0, "/a/cluster.toml") as record:
    record.repairs, record.last_repair_at, record.last_outcome = 2, 60.0, "repaired"
    record.save(SpecctlHome(Path(sys.argv[1])))
    print("watching", flush=True)
    time.sleep(3600)
"""


@contextlib.contextmanager
def watch_process(home: Path, *argv: str) -> Iterator[subprocess.Popen[str]]:
    """WATCH in a process of its own, `argv` after the home on its command line."""
    process = subprocess.Popen(
        [sys.executable, "-c", WATCH, str(home), *argv],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "watching"
        yield process
    finally:
        process.kill()
        process.wait(timeout=30)


@pytest.fixture
def other_watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[subprocess.Popen[str]]:
    monkeypatch.setattr(watch_record, "READER_GRACE_S", 0.2)  # a refusal waits this long
    with watch_process(tmp_path) as process:
        yield process


def test_down_with_a_watch_it_cannot_stop_takes_the_rest_down_and_fails(
    tmp_path: Path, other_watch: subprocess.Popen[str]
) -> None:
    """A watch whose record cannot be read (nobody to signal): down says so in its watch
    step, takes down what there is (nothing here), then fails naming the watch, rather than
    saying everything apply started is stopped."""
    home = SpecctlHome(tmp_path)
    home.watch_file.write_text("{")
    said = io.StringIO()
    stopped_else = r"^the watch would not stop \(a watch holds this home, but its record .*\); "
    with pytest.raises(WatchNotStopped, match=stopped_else + "everything else apply started"):
        take_down(home, JsonEvents(said), watch_wait_s=1)
    steps = [json.loads(line) for line in said.getvalue().splitlines()]
    assert steps[0]["name"] == "watch" and steps[0]["state"] == "failed", steps
    assert ("deployment", "skipped") in [(s["name"], s["state"]) for s in steps], steps
    assert other_watch.poll() is None  # nothing was signalled


def test_this_watch_is_seen_while_it_holds_the_home(tmp_path: Path) -> None:
    home = SpecctlHome(tmp_path)
    assert live_watch(home) is None
    with holding_watch(home, 30.0, "/etc/cluster.toml") as record:
        assert live_watch(home) == record
        assert re.fullmatch(
            rf"pid {os.getpid()}, every 30 s since \d\d:\d\d:\d\d; no repair so far",
            record.describe(),
        )
    assert live_watch(home) is None and not home.watch_file.exists()


def test_a_second_watch_is_refused_while_the_first_lives(
    tmp_path: Path, other_watch: subprocess.Popen[str]
) -> None:
    home = SpecctlHome(tmp_path)
    seen = live_watch(home)
    assert seen is not None and seen.pid == other_watch.pid and seen.repairs == 2
    with pytest.raises(WatchRunning) as refused, holding_watch(home, 5.0, "/b/cluster.toml"):
        pass
    said = str(refused.value)
    running = f"a watch already keeps this home's deployment running (pid {other_watch.pid}, "
    assert said.startswith(running + "every 10 s since ")
    assert "; 2 repairs, the last at " in said
    assert said.endswith(
        f": repaired; /a/cluster.toml): stop it first (kill {other_watch.pid}, or stop its service)"
    )
    assert live_watch(home) == seen, "the refused watch touched the first one's record"
    other_watch.kill()  # killed: the kernel drops its lock, and its record counts for nothing
    other_watch.wait(timeout=30)
    assert home.watch_file.exists() and live_watch(home) is None
    with holding_watch(home, 5.0, "/b/cluster.toml") as record:
        assert live_watch(home) == record


def test_a_damaged_record_of_a_live_watch_is_no_crash(
    tmp_path: Path, other_watch: subprocess.Popen[str]
) -> None:
    home = SpecctlHome(tmp_path)
    good = json.loads(home.watch_file.read_text())
    for damaged in ("{", "[]", json.dumps({**good, "started_at": "noon"}), json.dumps({"pid": 7})):
        home.watch_file.write_text(damaged)
        assert live_watch(home) is None
        unreadable = r"\(its record unreadable\): stop it first \(stop"
        with pytest.raises(WatchRunning, match=unreadable), holding_watch(home, 5.0, "x"):
            pass
        said = stop_watch(home, wait_s=1)  # nobody to signal: said, not guessed
        assert not said.stopped and said.pid is None
        assert "a watch holds this home, but its record " in said.message
    assert other_watch.poll() is None


def test_a_status_looking_at_the_lock_does_not_refuse_a_watch_starting(tmp_path: Path) -> None:
    """`status` takes the lock shared for a moment to see whether a watch holds it: a watch
    starting in that moment waits it out (it was refused with exit 4, for good under its
    service)."""
    import fcntl
    import threading

    home = SpecctlHome(tmp_path)
    home.ensure()
    reader = open(home.watch_file.with_suffix(".lock"), "a")  # noqa: SIM115
    fcntl.flock(reader, fcntl.LOCK_SH)
    threading.Timer(0.3, reader.close).start()
    with holding_watch(home, 5.0, "x") as record:
        assert live_watch(home) == record


def test_stop_watch_ends_the_watch_and_waits_for_the_home_to_be_let_go(tmp_path: Path) -> None:
    home = SpecctlHome(tmp_path)
    assert stop_watch(home) == watch_record.WatchStop(
        None, True, "no watch keeps this deployment running"
    )
    with watch_process(tmp_path, "--watch", "10") as process:  # as `apply --watch 10` runs
        stopped = stop_watch(home, wait_s=30)
        assert stopped == watch_record.WatchStop(
            process.pid, True, f"the watch (pid {process.pid}) stopped"
        )
        assert process.wait(timeout=30) == -15  # SIGTERM
        assert live_watch(home) is None


def test_stop_watch_signals_no_process_but_the_one_holding_the_watch(tmp_path: Path) -> None:
    """A record naming a pid that is not the watch holding the home (left by a watch that
    was killed, its pid now another process's) stops nothing: a process that is no watch,
    and a watch of another home, are both left alone."""
    home = SpecctlHome(tmp_path)
    other_home = tmp_path / "other"
    other_home.mkdir()
    with (
        watch_process(tmp_path) as holder,  # holds the home; its command line says no watch
        watch_process(other_home, "--watch", "5") as other,  # a watch, of another home
    ):
        record = json.loads(home.watch_file.read_text())
        for pid in (holder.pid, other.pid):
            home.watch_file.write_text(json.dumps({**record, "pid": pid}))
            said = stop_watch(home, wait_s=1)
            assert not said.stopped and said.pid == pid
            assert f"the watch record names pid {pid}, which is not the watch holding" in (
                said.message
            )
        assert holder.poll() is None and other.poll() is None


def test_status_shows_a_watch_in_its_first_apply(tmp_path: Path) -> None:
    """Nothing is applied yet, and a watch holds the home (its first apply under way):
    `specctl status` says both."""
    with watch_process(tmp_path, "--watch", "10") as watching:
        env = {**os.environ, "SPECCTL_HOME": str(tmp_path), "COLUMNS": "200"}
        command = [sys.executable, "-m", "specctl.cli", "status"]
        shown = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
        as_json = subprocess.run(
            [*command, "--json"], capture_output=True, text=True, timeout=60, env=env
        )
    assert shown.returncode == 1, shown.stderr
    assert f"watch      pid {watching.pid}, every 10 s since " in shown.stdout, shown.stdout
    assert "nothing applied" in shown.stdout
    report = json.loads(as_json.stdout)
    assert report["watch"]["pid"] == watching.pid and report["deployment"] is None
