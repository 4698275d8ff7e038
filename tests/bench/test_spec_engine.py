"""specctl's side of the bench: configurations measured side by side on one loaded pair."""

from bench.spec_engine import RunSpec, SpecBench
from specctl.demo_pair import require_demo_pair


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
