"""What `apply --watch` takes for broken in a status report: what an apply can mend, and
nothing it cannot (a shard Ray is restarting, a damaged metrics sample)."""

from specctl.apply.status import ShardLine, StatusReport
from specctl.apply.watch import broken


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
