"""Per-step deltas, abort, failure recovery, and the engine loop thread that serving builds on."""

import threading
import time
from pathlib import Path

import pytest
import torch

from daemon.runtime.engine.loop import EngineLoop
from daemon.runtime.engine.request import Request, RequestDelta
from daemon.runtime.errors import EngineOverloadedError, EngineStoppedError, RequestError
from daemon.runtime.proposers.base import Proposals, ProposeRequest
from daemon.runtime.proposers.ngram import NgramProposer
from daemon.runtime.sampling import block_maxima
from daemon.runtime.sampling.params import SamplingParams
from tests.engine.conftest import MAX_TOKENS
from tests.engine.helpers import DeltaCollector, make_engine


def _greedy(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _drain(engine, steps: int = 10_000) -> list[RequestDelta]:
    deltas: list[RequestDelta] = []
    for _ in range(steps):
        if not engine.has_unfinished():
            break
        deltas.extend(engine.step().deltas)
    return deltas


def test_deltas_add_up_to_the_outputs(target_dir: Path, draft_dir: Path, prompts, reference):
    engine = make_engine(target_dir, draft_dir, k=3, batch=4)
    for i, prompt in enumerate(prompts[:6]):
        engine.add_request(Request(f"r{i}", prompt, _greedy()))
    deltas = _drain(engine)
    for i in range(6):
        mine = [d for d in deltas if d.request_id == f"r{i}"]
        tokens = [t for d in mine for t in d.new_token_ids]
        assert tokens == reference[i]
        assert [d.finished for d in mine] == [False] * (len(mine) - 1) + [True]
        assert mine[-1].num_output_tokens == len(reference[i])
        assert mine[-1].finish_reason == "length"
        assert all(d.new_token_ids for d in mine[:-1])  # no empty progress deltas


def test_abort_running_and_waiting_frees_slots(target_dir: Path, draft_dir: Path, prompts):
    engine = make_engine(target_dir, draft_dir, k=2, batch=2)
    for i, prompt in enumerate(prompts[:3]):
        engine.add_request(Request(f"r{i}", prompt, _greedy(max_tokens=200)))
    first = engine.step()
    assert {d.request_id for d in first.deltas} == {"r0", "r1"}  # r2 waits for a slot
    assert engine.abort("r2") and engine.abort("r0")
    assert not engine.abort("nope")
    out = engine.step()
    ended = {d.request_id: d.finish_reason for d in out.deltas if d.finished}
    assert ended == {"r0": "abort", "r2": "abort"}
    assert [o.request_id for o in out.finished] == ["r0"]
    assert engine.num_running == 1 and engine.num_waiting == 0
    assert len(engine.scheduler.free_slots) == 1
    assert not engine.abort("r0")  # already gone
    engine.add_request(Request("r0", prompts[0], _greedy(max_tokens=2)))  # id reusable
    _drain(engine)
    assert len(engine.scheduler.free_slots) == 2


def test_first_tokens_are_handed_out_before_the_round(
    target_dir: Path, draft_dir: Path, prompts, reference
):
    """`step(on_prefilled)`: a request admitted in this step gets its first token (the
    prefill's) before the batch's round runs, and not again in the step's deltas; a request
    that ends on its first token ends there, once."""
    engine = make_engine(target_dir, draft_dir, k=3, batch=4)
    engine.add_request(Request("r0", prompts[0], _greedy()))
    deltas = list(engine.step().deltas)  # r0 prefilled and one round run
    engine.add_request(Request("r1", prompts[1], _greedy()))
    engine.add_request(Request("one", prompts[2], _greedy(max_tokens=1)))
    handed: list[RequestDelta] = []
    r0_at_hand: list[int] = []

    def prefilled(firsts: list[RequestDelta]) -> None:
        handed.extend(firsts)
        (r0,) = [s for s in engine.scheduler.running if s.request.request_id == "r0"]
        r0_at_hand.append(r0.num_output_tokens)

    r0_before = sum(len(d.new_token_ids) for d in deltas)
    out = engine.step(prefilled)
    assert {d.request_id: d.new_token_ids for d in handed} == {
        "r1": reference[1][:1],
        "one": reference[2][:1],
    }
    assert [d.finish_reason for d in handed if d.request_id == "one"] == ["length"]
    assert r0_at_hand == [r0_before]  # the round had not run yet
    assert "one" not in {d.request_id for d in out.deltas}  # ended once, early
    assert [o.request_id for o in out.finished] == ["one"]
    r1_rest = [t for d in out.deltas if d.request_id == "r1" for t in d.new_token_ids]
    assert r1_rest and r1_rest == reference[1][1 : 1 + len(r1_rest)]  # the round's, after it
    deltas += handed + out.deltas + _drain(engine)
    for i, rid in enumerate(["r0", "r1"]):
        assert [t for d in deltas if d.request_id == rid for t in d.new_token_ids] == reference[i]


def test_loop_streams_a_new_request_first_token_before_the_round(
    target_dir: Path, draft_dir: Path, prompts
):
    """The loop hands a request's first token to the sink on its own, as soon as the prefill
    is done, while another request keeps the batch busy; not with the round's tokens."""
    engine = make_engine(target_dir, draft_dir, k=3, batch=4)
    sink = DeltaCollector()
    loop = EngineLoop(engine, sink)
    loop.start()
    try:
        loop.submit(Request("busy", prompts[0], _greedy(max_tokens=4000)))
        deadline = time.monotonic() + 60
        while len(sink.tokens("busy")) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(sink.tokens("busy")) >= 8, "the busy request did not get going"
        loop.submit(Request("new", prompts[1], _greedy()))
        sink.wait_finished(["new"])
        loop.abort("busy")
        sink.wait_finished(["busy"])
        with sink.cond:
            (first,) = [o for o in sink.outputs if any(d.request_id == "new" for d in o.deltas)][:1]
        assert [(d.request_id, len(d.new_token_ids)) for d in first.deltas] == [("new", 1)]
        assert not first.rounds  # handed out before the round that step runs
    finally:
        loop.stop()


class _FailingProposer(NgramProposer):
    """The real n-gram proposer, failing on its `fail_on`-th call (fault injection)."""

    def __init__(self, fail_on: int) -> None:
        super().__init__()
        self.calls = 0
        self.fail_on = fail_on

    def propose(self, request: ProposeRequest) -> Proposals:
        self.calls += 1
        if self.calls == self.fail_on:
            raise RuntimeError("drafter exploded")
        return super().propose(request)


def test_loop_batches_concurrent_submits(target_dir: Path, draft_dir: Path, prompts, reference):
    engine = make_engine(target_dir, draft_dir, k=3, batch=8)
    sink = DeltaCollector()
    loop = EngineLoop(engine, sink)
    loop.start()
    try:
        threads = [
            threading.Thread(target=loop.submit, args=(Request(f"r{i}", prompts[i], _greedy()),))
            for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        sink.wait_finished([f"r{i}" for i in range(8)])
        for i in range(8):
            assert [t for d in sink.deltas(f"r{i}") for t in d.new_token_ids] == reference[i]
        assert max(r.batch_size for o in sink.outputs for r in o.rounds) > 1
        assert loop.num_in_flight == 0
        assert sink.outputs[-1].num_running == 0 and sink.outputs[-1].num_waiting == 0
    finally:
        loop.stop()


def test_loop_refuses_bad_and_excess_requests(target_dir: Path, prompts):
    engine = make_engine(target_dir, batch=1)
    sink = DeltaCollector()
    loop = EngineLoop(engine, sink, max_waiting=1)
    with pytest.raises(RequestError, match="empty"):
        loop.submit(Request("bad", [], _greedy()))
    # not started yet, so nothing leaves the inbox: capacity is 1 running + 1 waiting
    loop.submit(Request("a", prompts[0], _greedy()))
    with pytest.raises(RequestError, match="already in use"):
        loop.submit(Request("a", prompts[0], _greedy()))
    loop.submit(Request("b", prompts[1], _greedy()))
    with pytest.raises(EngineOverloadedError, match="at most 2"):
        loop.submit(Request("c", prompts[2], _greedy()))
    loop.abort("b")
    loop.start()
    try:
        sink.wait_finished(["a", "b"])
        assert sink.deltas("b")[-1].finish_reason == "abort"
        assert sink.deltas("a")[-1].finish_reason == "length"
    finally:
        loop.stop()
    with pytest.raises(EngineStoppedError):
        loop.submit(Request("d", prompts[0], _greedy()))


def test_loop_survives_a_failed_step_and_stop_ends_requests(target_dir: Path, prompts, reference):
    engine = make_engine(target_dir, k=2, batch=4)
    engine.proposer = _FailingProposer(fail_on=2)
    engine.controller.config.fixed_k = engine.controller.config.max_k = 2
    sink = DeltaCollector()
    loop = EngineLoop(engine, sink)
    loop.start()
    try:
        loop.submit(Request("a", prompts[0], _greedy()))
        sink.wait_finished(["a"])
        last = sink.deltas("a")[-1]
        assert last.finish_reason == "error" and "drafter exploded" in (last.error or "")
        # the engine was emptied and keeps serving
        assert len(engine.scheduler.free_slots) == 4
        loop.submit(Request("b", prompts[1], _greedy()))
        sink.wait_finished(["b"])
        assert [t for d in sink.deltas("b") for t in d.new_token_ids] == reference[1]
        loop.submit(Request("long", prompts[2], _greedy(max_tokens=10_000)))
    finally:
        loop.stop()
    assert sink.deltas("long")[-1].finish_reason in {"error", "length"}
    assert loop.num_in_flight == 0


def test_a_round_failing_after_a_request_ended_on_its_first_token(
    target_dir: Path, prompts, reference
):
    """A request that ends at its prefill is reported before the round; when that round then
    fails, the loop lives on: the other request ends with the error, the ended one is not
    reported again, and every slot is free for the next request."""
    engine = make_engine(target_dir, k=2, batch=4)
    engine.proposer = _FailingProposer(fail_on=1)
    engine.controller.config.fixed_k = engine.controller.config.max_k = 2
    sink = DeltaCollector()
    loop = EngineLoop(engine, sink)
    # both in the inbox before the loop runs: admitted in the same step
    loop.submit(Request("busy", prompts[0], _greedy()))
    loop.submit(Request("one", prompts[1], _greedy(max_tokens=1)))
    loop.start()
    try:
        sink.wait_finished(["busy", "one"])
        assert [(d.finish_reason, d.new_token_ids) for d in sink.deltas("one")] == [
            ("length", reference[1][:1])
        ]
        assert sink.last("busy").finish_reason == "error"
        assert "drafter exploded" in (sink.last("busy").error or "")
        assert len(engine.scheduler.free_slots) == 4
        loop.submit(Request("after", prompts[2], _greedy()))
        sink.wait_finished(["after"])
        assert sink.tokens("after") == reference[2]
    finally:
        loop.stop()


class _FailingAdmitProposer(NgramProposer):
    """The real n-gram proposer, failing when it is first told of new sequences, i.e. while
    they are being admitted: neither waiting nor running (fault injection)."""

    def __init__(self) -> None:
        super().__init__()
        self.num_failures = 0

    def admit(self, slots: list[int], prompts: list[list[int]]) -> None:
        if self.num_failures == 0:
            self.num_failures += 1
            raise RuntimeError("admission exploded")
        super().admit(slots, prompts)


def test_a_failure_while_admitting_ends_those_requests_and_frees_their_slots(
    target_dir: Path, prompts, reference
):
    engine = make_engine(target_dir, k=2, batch=2)
    engine.proposer = _FailingAdmitProposer()
    for name, prompt in (("a", prompts[0]), ("b", prompts[1])):
        engine.add_request(Request(name, prompt, _greedy()))
    loop = EngineLoop(engine, sink := DeltaCollector())
    loop.start()
    try:
        sink.wait_finished(["a", "b"])  # both end with the error, none is left waiting
        for name in ("a", "b"):
            last = sink.deltas(name)[-1]
            assert last.finish_reason == "error" and "admission exploded" in (last.error or "")
        assert sorted(engine.scheduler.free_slots) == [0, 1]
        loop.submit(Request("c", prompts[2], _greedy()))  # and the engine keeps serving
        sink.wait_finished(["c"])
        assert [t for d in sink.deltas("c") for t in d.new_token_ids] == reference[2]
    finally:
        loop.stop()


def test_speculation_changes_between_steps(target_dir: Path, draft_dir: Path, prompts, reference):
    engine = make_engine(target_dir, draft_dir, k=2, batch=4)
    sink = DeltaCollector()
    loop = EngineLoop(engine, sink)
    loop.start()
    try:
        loop.submit(Request("a", prompts[0], _greedy(max_tokens=200)))
        loop.call_between_steps(lambda e: e.set_speculation(5, adaptive=True), timeout_s=30)
        assert engine.config.num_speculative_tokens == 5 and engine.controller.config.adaptive
        loop.submit(Request("b", prompts[1], _greedy()))
        sink.wait_finished(["a", "b"])
        assert sink.tokens("b") == reference[1]  # still lossless after the change
        assert engine.controller.config.max_k == 5
        with pytest.raises(RequestError, match="must be in"):
            loop.call_between_steps(lambda e: e.set_speculation(99, adaptive=False), 30)
        measured = engine.controller.costs
        assert measured.has_any_verify
        loop.call_between_steps(lambda e: e.set_speculation(5, adaptive=True), timeout_s=30)
        assert engine.controller.costs is measured  # costs are kept by default
        loop.call_between_steps(lambda e: e.set_speculation(5, True, forget_costs=True), 30)
        assert engine.controller.costs is not measured
        assert not engine.controller.costs.has_any_verify  # starts from nothing
        since = len(sink.outputs)
        loop.submit(Request("c", prompts[1], _greedy()))
        sink.wait_finished(["c"])
        assert sink.tokens("c") == reference[1]
        assert any(r.num_draft_tokens > 0 for o in sink.outputs[since:] for r in o.rounds)
    finally:
        loop.stop()


def test_a_step_keeps_no_logits_alive(target_dir: Path, draft_dir: Path, prompts):
    """The LM head's block maxima hold their logits (sampling/block_maxima.py): after a step
    none are left, so an idle engine holds no round's logits."""
    engine = make_engine(target_dir, draft_dir, k=3, batch=4)
    engine.add_request(Request("r0", prompts[0], _greedy()))
    engine.step()  # the prefill and a round: the LM head recorded maxima
    logits = torch.zeros(2, 64)
    block_maxima.remember(logits, torch.zeros(2, 1))  # as if a pass were in flight
    engine.step()
    assert block_maxima.lookup(logits) is None
    assert block_maxima.held() == 0
