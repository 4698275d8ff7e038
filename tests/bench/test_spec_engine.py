"""specctl's side of the bench: configurations measured side by side on one loaded pair."""

from collections.abc import Iterable
from typing import Any

from bench.spec_engine import RunSpec, SpecBench
from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.request import Request, RequestOutput
from specctl.demo_pair import require_demo_pair


class _LoggedBench(SpecBench):
    """Notes which engine ran which requests, in order (the engines are real)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[int, list[str]]] = []  # (engine index, request ids) per call
        self.num_engines = 0

    def engine(self, concurrency: int, k: int, adaptive: bool) -> SpecEngine:
        engine = super().engine(concurrency, k, adaptive)
        index, run = self.num_engines, engine.generate
        self.num_engines += 1

        def generate(requests: Iterable[Request]) -> list[RequestOutput]:
            batch = list(requests)
            self.calls.append((index, [r.request_id for r in batch]))
            return run(batch)

        engine.generate = generate  # type: ignore[method-assign]
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
