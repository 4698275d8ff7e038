"""specctl's side of the bench: configurations measured side by side on one loaded pair."""

from collections.abc import Iterable
from typing import Any

from bench.spec_engine import RunSpec, SpecBench
from daemon.runtime.engine.engine import SpecEngine, StepOutput
from daemon.runtime.engine.request import Request, RequestOutput
from specctl.demo_pair import require_demo_pair


class _LoggedBench(SpecBench):
    """Notes which engine ran which requests, in order (the engines are real)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[int, list[str]]] = []  # (engine index, request ids) per call
        # (engine index, its running sequences' (slot, request id)) per measured step
        self.steps: list[tuple[int, list[tuple[int, str]]]] = []
        self.made = 0
        self.generating = False

    def engine(self, concurrency: int, k: int, adaptive: bool, first_slot: int = 0) -> SpecEngine:
        engine = super().engine(concurrency, k, adaptive, first_slot)
        index, run, step = self.made, engine.generate, engine.step
        self.made += 1

        def generate(requests: Iterable[Request]) -> list[RequestOutput]:
            batch = list(requests)
            self.calls.append((index, [r.request_id for r in batch]))
            self.generating = True
            try:
                return run(batch)
            finally:
                self.generating = False

        def logged_step() -> StepOutput:
            out = step()
            if not self.generating:
                running = engine.scheduler.running
                self.steps.append((index, [(s.slot, s.request.request_id) for s in running]))
            return out

        engine.generate = generate  # type: ignore[method-assign]
        engine.step = logged_step  # type: ignore[method-assign]
        return engine


def test_run_group_measures_each_configuration_in_order() -> None:
    target, draft = require_demo_pair()
    bench = SpecBench(target, draft, "float32", max_batch=2)
    prompts = [bench.tokenizer.encode("def main():"), bench.tokenizer.encode("import os\n")]
    specs = [RunSpec("target-only"), RunSpec("spec k=2", k=2), RunSpec("adaptive", 3, True)]
    results = bench.run_group(specs, prompts, max_tokens=6, concurrency=2, repeats=3)
    assert [r.mode for r in results] == ["target-only", "spec k=2", "adaptive"]
    for r in results:
        assert len(r.repeats_tokens_per_s) == 3
        assert r.repeats_tokens_per_s == sorted(r.repeats_tokens_per_s)
        assert r.tokens_per_s == r.repeats_tokens_per_s[1]  # the median repeat
        assert r.num_tokens == 12 and r.concurrency == 2
    assert results[0].num_drafts == 0 and results[1].num_drafts > 0
    # greedy: every configuration emits the target's own tokens
    assert results[1].output_token_ids == results[0].output_token_ids
    assert results[2].output_token_ids == results[0].output_token_ids
    # the controller's time per round, a part of the time outside the passes
    for r in results:
        assert 0.0 < r.choose_per_round_us < 1000 * r.overhead_per_round_ms


def test_at_concurrency_one_the_configurations_take_turns_request_by_request() -> None:
    """Each repeat runs request 0 on every configuration, then request 1, ...: the same work
    as whole workloads in turn, compared seconds apart; every figure is over the whole
    workload and greedy outputs still match."""
    target, draft = require_demo_pair()
    bench = _LoggedBench(target, draft, "float32", max_batch=1)
    prompts = [bench.tokenizer.encode(text) for text in ("def main():", "import os\n", "x = 1")]
    specs = [RunSpec("target-only"), RunSpec("spec k=2", k=2)]
    results = bench.run_group(specs, prompts, max_tokens=5, concurrency=1, repeats=2)
    measured = bench.calls[2:]  # after each engine's warm-up
    assert [i for i, _ in bench.calls[:2]] == [0, 1]
    assert measured == [
        (engine, [f"r{repeat}-{request}"])
        for repeat in range(2)
        for request in range(3)
        for engine in range(2)
    ]
    for r in results:
        assert r.num_requests == 3 and r.num_tokens == 15 and r.concurrency == 1
        assert len(r.repeats_tokens_per_s) == 2 and r.wall_s > 0.0
    assert results[0].num_drafts == 0 and results[1].num_drafts > 0
    assert results[1].output_token_ids == results[0].output_token_ids


def test_above_concurrency_one_the_engines_hold_their_batches_at_once_and_step_in_turn() -> None:
    """With a range of KV-cache slots per configuration, every engine holds its whole batch
    at once, in its own slots, and they step in turn (the least time so far next): slots
    shared by two engines would mix their K/V and their greedy outputs would differ. The first
    to step turns with the repeat."""
    target, draft = require_demo_pair()
    bench = _LoggedBench(target, draft, "float32", max_batch=2, num_engines=3, max_model_len=128)
    assert bench.target.num_slots == bench.draft.num_slots == 6
    assert bench.target.max_model_len == 128
    prompts = [bench.tokenizer.encode(text) for text in ("def main():", "import os\n")]
    specs = [RunSpec("target-only"), RunSpec("spec k=2", k=2), RunSpec("adaptive", 3, True)]
    results = bench.run_group(specs, prompts, max_tokens=12, concurrency=2, repeats=2)
    assert [i for i, _ in bench.calls] == [0, 1, 2]  # only the warm-ups run whole
    slots = {i: {slot for j, seqs in bench.steps for slot, _ in seqs if j == i} for i in range(3)}
    assert slots == {0: {0, 1}, 1: {2, 3}, 2: {4, 5}}
    # each repeat's steps (a finished step may have retired its sequences: no id, no repeat)
    for repeat, starts in ((0, [0, 1, 2]), (1, [1, 2, 0])):
        tag = f"r{repeat}-"
        order = [j for j, seqs in bench.steps if any(rid.startswith(tag) for _, rid in seqs)]
        assert order[:3] == starts  # every engine starts its batch at once, in turn
        for i in range(3):  # and none runs its repeat alone: the others step before it ends
            before_last = order[: len(order) - order[::-1].index(i)]
            assert sum(1 for j in before_last if j != i) >= 2
    for r in results:
        assert r.num_tokens == 24 and r.concurrency == 2 and len(r.repeats_tokens_per_s) == 2
    assert results[0].num_drafts == 0 and results[1].num_drafts > 0
    assert results[1].output_token_ids == results[0].output_token_ids
    assert results[2].output_token_ids == results[0].output_token_ids
