"""What `apply --watch` takes for broken in a status report: what an apply can mend, and
nothing it cannot (a shard Ray is restarting, a damaged metrics sample); and a watch ends
once nothing is applied."""

import io
import json
import threading
from pathlib import Path

import pytest

from specctl.apply import watch as watch_module
from specctl.apply.state import AppliedState
from specctl.apply.status import ShardLine, StatusReport
from specctl.apply.watch import broken, watch
from specctl.apply.watch_record import holding_watch
from specctl.commands.apply_view import JsonEvents
from specctl.home import SpecctlHome


def _report(*states: str, problems: list[str] | None = None) -> StatusReport:
    shards = [
        ShardLine(f"d.r0.{role}", role, 0, "n", state)
        for role, state in zip(("verifier", "drafter"), states, strict=False)
    ]
    return StatusReport(
        deployment="d",
        is_server_alive=True,
        server_status="ready",
        shards=shards,
        problems=problems or [],
    )


def test_whole_or_loading_is_not_broken() -> None:
    assert broken(_report("ready", "ready")) == ""
    assert broken(_report("ready", "loading")) == ""  # Ray restarts a dead actor: it loads


def test_a_shard_down_is_named_with_its_error() -> None:
    report = _report("ready", "unreachable")
    report.shards[1].error = "ActorDiedError: the node died"
    assert broken(report) == "d.r0.drafter unreachable (ActorDiedError: the node died)"
    assert broken(_report("failed", "stopped")) == "d.r0.verifier failed; d.r0.drafter stopped"


def test_the_serving_process_gone_silent_or_degraded() -> None:
    gone = _report("ready", "ready", problems=["the serving process is not running (run ...)"])
    assert broken(gone) == "the serving process is not running (run ...)"
    silent = "the serving process at http://h:1 did not answer: ReadTimeout"
    assert broken(_report("ready", problems=[silent])) == silent
    degraded = _report("ready")
    degraded.server_status = "degraded"
    assert broken(degraded) == "the serving process is degraded"


def test_what_an_apply_cannot_mend_is_not_broken() -> None:
    damaged = "metrics history unreadable: /h/specctl.db: a damaged sample (x)"
    assert broken(_report("ready", "ready", problems=[damaged])) == ""
    assert broken(StatusReport(problems=["nothing applied (run `specctl apply`)"])) == ""


def test_a_watch_ends_once_nothing_is_applied(tmp_path: Path) -> None:
    """A deployment taken down without stopping its watch (by a `down` that could not signal
    it, say): the watch's next look finds no state.json and ends, repairing nothing."""
    home = SpecctlHome(tmp_path)
    home.ensure()
    said = io.StringIO()

    def never(path: Path, text: str) -> object:
        raise AssertionError(f"repaired {path} with nothing applied")

    with holding_watch(home, 0.5, str(tmp_path / "cluster.toml")) as record:
        done = threading.Thread(
            target=watch, args=(home, JsonEvents(said), never, 0.05, threading.Event(), record)
        )
        done.start()
        done.join(timeout=30)
    assert not done.is_alive(), said.getvalue()
    steps = [json.loads(line) for line in said.getvalue().splitlines()]
    assert [s["detail"] for s in steps][-1] == "nothing is applied any more: stopped watching"


class _AskedDuringLook(threading.Event):
    """The stop a signal sets, arriving during the watch's `look`-th look: after its wait
    returned, before the look is done (the look goes on)."""

    def __init__(self, look: int) -> None:
        super().__init__()
        self.look, self.waits = look, 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        if self.waits == self.look:
            self.set()
            return False
        return super().wait(timeout)


def test_a_watch_asked_to_stop_during_a_look_repairs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployment whose serving process is gone is broken, and the second look in a row
    would repair it; a SIGTERM (`specctl down`'s) during that look ends the watch instead of
    starting an apply down would then wait on or find undone."""
    monkeypatch.setattr(watch_module, "GRACE_S", 0.0)
    home = SpecctlHome(tmp_path)
    home.ensure()
    config = tmp_path / "cluster.toml"
    config.write_text("# applied\n")
    state = AppliedState(
        deployment="d",
        config_path=str(config),
        config_text=config.read_text(),
        plan_json="{}",
        served_model_name="m",
        ray_address="127.0.0.1:1",
        token_file=str(tmp_path / "token"),
        local_root=None,
    )
    state.save(home.state_file)  # and no server.json: the serving process is not running
    said, repairs = io.StringIO(), []
    with holding_watch(home, 0.5, str(config)) as record:
        stop = _AskedDuringLook(2)
        watch(home, JsonEvents(said), lambda p, t: repairs.append(p), 0.05, stop, record)
    assert repairs == [], said.getvalue()
    steps = [json.loads(line) for line in said.getvalue().splitlines()]
    assert steps[-1]["detail"] == "stopped watching; the deployment is left as it is", steps
    assert not any(s["detail"].startswith("repairing") for s in steps), steps
