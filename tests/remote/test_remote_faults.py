"""Drafter faults mid-generation: requests complete with correct output at k = 0, and
speculation resumes once a drafter answers again (after a full resync)."""

import time
from pathlib import Path

import pytest

from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.request import Request
from daemon.runtime.errors import SpecError
from daemon.runtime.proposers.base import Proposals, ProposeRequest
from daemon.runtime.proposers.ngram import NgramProposer
from daemon.runtime.remote.draft_server import DraftServer
from daemon.runtime.remote.options import RemoteOptions
from daemon.runtime.sampling.params import SamplingParams
from tests.remote.conftest import MAX_TOKENS
from tests.remote.helpers import RemoteSetup, draft_proposer, remote_engine

FAST_PROBES = {"probe_every_rounds": 2, "probe_interval_s": 0.0, "probe_timeout_s": 2.0}


def _options(mode: str, **kwargs: float) -> RemoteOptions:
    return RemoteOptions(mode=mode, **{**FAST_PROBES, **kwargs})  # type: ignore[arg-type]


def _start(engine: SpecEngine, prompts: list[list[int]]) -> None:
    for i, prompt in enumerate(prompts):
        engine.add_request(Request(f"r{i}", prompt, SamplingParams(max_tokens=MAX_TOKENS)))


def _steps(engine: SpecEngine, num: int, done: dict[str, list[int]]) -> None:
    for _ in range(num):
        for out in engine.step().finished:
            done[out.request_id] = out.token_ids


def _finish(setup: RemoteSetup, done: dict[str, list[int]]) -> list[list[int]]:
    while setup.engine.has_unfinished():
        _steps(setup.engine, 1, done)
    return [done[f"r{i}"] for i in range(len(done))]


def _fresh_server(draft_dir: Path | None, batch: int) -> DraftServer:
    return DraftServer(draft_proposer(draft_dir, batch))


@pytest.mark.parametrize("mode", ["sync", "overlapped"])
@pytest.mark.parametrize("fault", ["kill", "hang", "restart"])
def test_drafter_lost_then_back(target_dir, draft_dir, prompts, reference, mode, fault) -> None:
    options = _options(mode, call_timeout_s=0.5, prepare_timeout_s=0.5)
    done: dict[str, list[int]] = {}
    with remote_engine(target_dir, draft_dir, options=options, batch=8) as setup:
        _start(setup.engine, prompts)
        _steps(setup.engine, 3, done)
        drafted_before = setup.engine.stats.num_draft_tokens
        assert drafted_before > 0
        if fault == "kill":
            setup.transport.kill()
        elif fault == "hang":
            setup.transport.hang()
        else:  # a new instance takes over silently: replies carry a new instance id
            setup.transport.restart(_fresh_server(draft_dir, 8))
        _steps(setup.engine, 4, done)  # rounds without a drafter (k = 0)
        stats = setup.remote.stats
        assert stats.num_drafter_losses == 1 and stats.num_rounds_without_drafter >= 1
        if fault != "restart":
            setup.transport.restart(_fresh_server(draft_dir, 8))
        drafted_down = setup.engine.stats.num_draft_tokens
        # a probe's answer comes from the server's thread, looked at by the round after it
        # arrives: rounds of 8 tiny sequences take a few ms, and in a loaded run the few
        # rounds left of 24 tokens ended before it came back (no resync, CI, hang-overlapped)
        deadline = time.monotonic() + 10.0
        while not stats.num_resyncs and setup.engine.has_unfinished():
            _steps(setup.engine, 1, done)
            time.sleep(0.05)
            assert time.monotonic() < deadline, "no resync within 10 s of the drafter's return"
        outputs = _finish(setup, done)
        assert outputs == reference
        assert stats.num_resyncs == 1
        assert setup.engine.stats.num_draft_tokens > drafted_down  # speculation resumed
        setup.remote.flush()  # releases travel with the next request: there was none
        assert setup.transport.server.slots == []


def test_drafter_that_lost_its_state_under_the_same_id(target_dir, draft_dir, prompts, reference):
    """Updates for slots the drafter does not know come back as slot errors; those slots
    are re-admitted with their full token lists and go on speculating. (Sync mode: no call
    is in flight when the drafter is swapped, so nothing reveals the swap but the errors.)"""
    done: dict[str, list[int]] = {}
    with remote_engine(target_dir, draft_dir, options=_options("sync")) as setup:
        _start(setup.engine, prompts)
        _steps(setup.engine, 3, done)
        old = setup.transport.server
        setup.transport.restart(
            DraftServer(draft_proposer(draft_dir, 8), instance_id=old.instance_id)
        )
        outputs = _finish(setup, done)
        assert outputs == reference
        assert setup.remote.stats.num_slot_resyncs >= 1
        assert setup.remote.stats.num_drafter_losses == 0


class _FailingProposer(NgramProposer):
    """n-gram lookup that raises while `is_failing` (fault injection on a real proposer)."""

    is_failing: bool = False

    def propose(self, request: ProposeRequest) -> Proposals:
        if self.is_failing:
            raise SpecError("injected proposer failure")
        return NgramProposer.propose(self, request)


def test_proposer_errors_fall_back_to_k0(target_dir, prompts) -> None:
    repetitive = [p * 3 for p in prompts[:4]]
    done: dict[str, list[int]] = {}
    # enough tokens left after the failures for the drafter's probe to come back and resync
    # before the requests finish: with 12, an n-gram drafter's first rounds (5 tokens each)
    # could finish them first on a loaded machine (1 run in ~6 with another test running)
    max_tokens = 40
    with remote_engine(target_dir, None, options=_options("sync"), batch=4) as setup:
        proposer = _FailingProposer()
        setup.transport.restart(DraftServer(proposer))
        for i, prompt in enumerate(repetitive):
            params = SamplingParams(max_tokens=max_tokens)
            setup.engine.add_request(Request(f"r{i}", prompt, params))
        _steps(setup.engine, 2, done)
        proposer.is_failing = True
        _steps(setup.engine, 3, done)
        assert setup.remote.stats.num_rounds_without_drafter >= 1
        proposer.is_failing = False
        while setup.engine.has_unfinished() and setup.remote.stats.num_resyncs == 0:
            # the drafter answers the probe on its own thread: rounds at k = 0 of a tiny
            # model could otherwise hold the interpreter until the requests finish
            time.sleep(0.002)
            _steps(setup.engine, 1, done)
        outputs = _finish(setup, done)
    from tests.engine.helpers import make_engine, run_greedy

    plain = run_greedy(make_engine(target_dir, batch=4), repetitive, max_tokens)
    assert outputs == [o.token_ids for o in plain]
    assert setup.remote.stats.num_resyncs >= 1
