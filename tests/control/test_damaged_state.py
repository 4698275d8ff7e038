"""`status` and `down` over damaged files in `$SPECCTL_HOME`, through the real CLI: a message
naming the file and the field, no traceback, and no process signalled that apply did not
start (a pid in server.json may be another program's by now)."""

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.specd.process_tree import process_start_ticks
from db import DeploymentRow, Store
from db.tables import MetricSample
from specctl.apply.state import AppliedState, ServerState
from specctl.apply.status import summarise
from specctl.deploy.server_process import ServerRecord, ServerRecordError

from .deployment_cli import Cli


def _state(home: Path) -> Path:
    """A deployment state with nothing left running: its Ray head is gone (port 1)."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "state.json"
    AppliedState(
        "dep", "/x", "", "{}", "m", "127.0.0.1:1", str(home / "token"), None,
        server=ServerState("127.0.0.1", 1, None, 4, "fp"),
    ).save(path)  # fmt: skip
    return path


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A program of its own session (its pid is its session id), as `specctl serve` runs."""
    process = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)


def _server_json(home: Path, **fields: object) -> Path:
    record = {"pid": 2, "url": "http://127.0.0.1:1", "argv": ["serve"], "fingerprint": "f"}
    record["started_at"] = 1.0
    record.update(fields)
    path = home / "server.json"
    path.write_text(json.dumps(record))
    return path


def test_down_leaves_a_reused_pid_alone(tmp_path: Path, bystander: subprocess.Popen) -> None:
    """server.json names a pid that is now another program's session: not `specctl serve`,
    and started after the record. down signalled it (SIGTERM, then SIGKILL)."""
    home = tmp_path / "home"
    _state(home)
    _server_json(home, pid=bystander.pid, argv=["-m", "specctl.cli", "serve"])
    cli = Cli(home)
    done = cli.run("down")
    assert done.returncode == 0, done.stdout + done.stderr
    assert bystander.poll() is None  # still running
    assert not (home / "server.json").exists() and not (home / "state.json").exists()


@pytest.mark.parametrize(
    ("pid", "why"),
    [
        (0, "field pid: 0"),  # session 0: down signalled every process outside a session
        (1, "field pid: 1"),
        (True, "field pid: True"),  # True == 1
        (-5, "field pid: -5"),
        ("123", "field pid: '123'"),
        (12.0, "field pid: 12.0"),
    ],
)
def test_a_pid_that_is_no_process_of_ours_is_refused(tmp_path: Path, pid: object, why: str) -> None:
    """Read, not run through `down`: with the check gone, such a test would signal the
    machine's processes."""
    path = _server_json(tmp_path, pid=pid)
    with pytest.raises(
        ServerRecordError, match=re.escape(f"{path}: not a serving-process record: {why}")
    ):
        ServerRecord.load(path)


def test_a_server_record_that_cannot_be_trusted_is_kept_and_named(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _state(home)
    why = "field argv: 'serve'"
    record = _server_json(home, argv="serve")
    cli = Cli(home)
    for command, code in (("down", 1), ("status", 3)):  # status: a problem of the deployment
        done = cli.run(command)
        assert done.returncode == code, done.stdout + done.stderr
        said = " ".join((done.stdout + done.stderr).split())
        assert f"{record}: not a serving-process record: {why}" in said
        assert "Traceback" not in done.stderr
    # the server it names may still run: the user decides, and down took nothing down
    assert record.exists() and (home / "state.json").exists()


def test_a_truncated_server_record_is_kept_and_named(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _state(home)
    record = home / "server.json"
    record.write_text('{"pid": 123, "url": "http://127.0.0.1:1", "fing')
    done = Cli(home).run("down")
    assert done.returncode == 1
    assert f"{record}: not a serving-process record: cannot read it" in done.stderr
    assert record.exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[1, 2, 3]", "malformed deployment state (not a JSON object)"),
        (None, "malformed deployment state (ray_address: Input should be a valid string, got 5)"),
    ],
)
def test_a_damaged_state_is_named_by_status_and_down(
    tmp_path: Path, text: str | None, expected: str
) -> None:
    home = tmp_path / "home"
    path = _state(home)
    if text is None:
        raw = json.loads(path.read_text())
        raw["ray_address"] = 5
        text = json.dumps(raw)
    path.write_text(text)
    cli = Cli(home)
    for command in ("status", "down"):
        done = cli.run(command)
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"{path}: {expected}" in " ".join((done.stdout + done.stderr).split())
        assert "Traceback" not in done.stderr
    assert path.exists()


def test_down_touches_no_ray_directory_but_its_own(tmp_path: Path) -> None:
    """A state.json naming another directory (another home's) had it deleted."""
    home = tmp_path / "home"
    path = _state(home)
    victim = tmp_path / "victim"
    (victim / "keep").mkdir(parents=True)
    raw = json.loads(path.read_text())
    raw["local_root"], raw["local_nodes"] = str(victim), ["n"]
    path.write_text(json.dumps(raw))
    done = Cli(home).run("down")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"local_root {str(victim)!r} is not this home's directory" in done.stderr
    assert sorted(p.name for p in victim.iterdir()) == ["keep"]


def test_live_figures_from_samples_without_acceptance_lengths() -> None:
    """Both columns may be NULL apart: the mean of no lengths was a StatisticsError."""
    sample = MetricSample(
        deployment_id=1, time_unix_s=10.0, tokens_per_s=5.0, acceptance_rate=0.5,
        mean_acceptance_length=None, batch_size=1, num_requests_running=1,
    )  # fmt: skip
    figures = summarise([sample], 11.0)
    assert figures.acceptance_rate == 0.5 and figures.mean_acceptance_length is None


def test_a_server_is_told_from_a_later_process_by_its_start_tick() -> None:
    """The kernel's start tick, read as the server started, with the pid names one process
    for good: a wall time derived from it moved when the clock was stepped, and then `down`
    took the live server for another program and left it running."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "specctl.cli", "serve"],
        start_new_session=True,
    )
    try:
        ticks = process_start_ticks(process.pid)
        assert ticks is not None

        def record(start_ticks: int | None) -> ServerRecord:
            argv = ["serve"]
            return ServerRecord(process.pid, "http://127.0.0.1:1", argv, "f", 1.0, start_ticks)

        assert record(ticks).session() == [process.pid]
        assert record(None).session() == [process.pid]  # a record from before the field
        assert record(ticks + 1).session() == []  # the pid is another process's now
    finally:
        process.kill()
        process.wait(timeout=10)


def test_a_state_naming_a_path_that_is_not_utf8_loads(tmp_path: Path) -> None:
    """Such a path reaches Python with lone surrogates, which json.dumps writes as \\udcXX:
    pydantic's JSON parser refused the file, and `down` could not stop what it names."""
    path = _state(tmp_path)
    state = AppliedState.load(path)
    assert state is not None
    state.config_path = "/tmp/caf\udce9/cluster.toml"
    state.save(path)
    loaded = AppliedState.load(path)
    assert loaded is not None and loaded.config_path == state.config_path


def test_down_records_the_stop_in_the_store_apply_recorded_the_deployment_in(
    tmp_path: Path,
) -> None:
    """state.db_path, which `status` and the serving process read; `down` wrote to the home's
    store, and the deployment stayed "running" where status looks."""
    home = tmp_path / "home"
    path = _state(home)
    store_file = tmp_path / "elsewhere" / "specctl.db"
    store_file.parent.mkdir()
    with Store.open(store_file, role="writer") as store:
        deployment_id = store.add_deployment(
            DeploymentRow(
                name="dep", config_path="/x", config_text="", plan_json="{}",
                applied_unix_s=1.0, status="running",
            )
        )  # fmt: skip
    raw = json.loads(path.read_text())
    raw["db_path"], raw["deployment_id"] = str(store_file), deployment_id
    path.write_text(json.dumps(raw))
    done = Cli(home).run("down")
    assert done.returncode == 0, done.stdout + done.stderr
    with Store.open(store_file, role="reader") as store:
        row = store.deployment(deployment_id)
    assert row is not None and row.status == "stopped"
    assert not (home / "specctl.db").exists()
