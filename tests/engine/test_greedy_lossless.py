"""Greedy speculative decoding must be token-identical to target-only greedy decoding and to
transformers' generate(do_sample=False), whatever the proposer, k, batch shape or backend."""

from pathlib import Path

import pytest

from tests.engine.conftest import MAX_TOKENS
from tests.engine.helpers import make_engine, run_greedy


def _tokens(outputs) -> list[list[int]]:
    return [o.token_ids for o in outputs]


def test_target_only_matches_transformers(target_dir: Path, prompts, reference) -> None:
    engine = make_engine(target_dir)
    assert _tokens(run_greedy(engine, prompts, MAX_TOKENS)) == reference


@pytest.mark.parametrize("k", [0, 1, 4, 8])
def test_random_draft_batch16(
    target_dir: Path, draft_dir: Path, prompts, reference, k: int
) -> None:
    engine = make_engine(target_dir, draft_dir, k=k)
    outputs = run_greedy(engine, prompts, MAX_TOKENS)
    assert _tokens(outputs) == reference
    if k:
        assert engine.stats.num_draft_tokens > 0
        # An unrelated random draft is almost never right.
        assert engine.stats.acceptance_rate < 0.3
    else:
        assert engine.stats.num_draft_tokens == 0


@pytest.mark.parametrize("k", [1, 4])
def test_batch1(target_dir: Path, draft_dir: Path, prompts, reference, k: int) -> None:
    engine = make_engine(target_dir, draft_dir, k=k, batch=1)
    assert _tokens(run_greedy(engine, prompts[:4], MAX_TOKENS)) == reference[:4]


def test_draft_equal_to_target_accepts_everything(target_dir: Path, prompts, reference) -> None:
    engine = make_engine(target_dir, target_dir, k=4)
    outputs = run_greedy(engine, prompts, MAX_TOKENS)
    assert _tokens(outputs) == reference
    assert engine.stats.acceptance_rate > 0.97
    # 4 drafts accepted + 1 bonus per round: far fewer rounds than tokens.
    assert engine.stats.mean_acceptance_length > 4.5


@pytest.mark.parametrize("same", [True, False], ids=["same-draft", "random-draft"])
def test_adaptive(target_dir: Path, draft_dir: Path, prompts, reference, same: bool) -> None:
    engine = make_engine(target_dir, target_dir if same else draft_dir, k=8, adaptive=True)
    assert _tokens(run_greedy(engine, prompts, MAX_TOKENS)) == reference


def test_ngram(target_dir: Path, prompts, reference) -> None:
    engine = make_engine(target_dir, ngram=True, k=4)
    assert _tokens(run_greedy(engine, prompts, MAX_TOKENS)) == reference


def test_fallback_backend(target_dir: Path, draft_dir: Path, prompts, reference) -> None:
    engine = make_engine(target_dir, draft_dir, k=4, backend="hf")
    assert _tokens(run_greedy(engine, prompts[:6], MAX_TOKENS)) == reference[:6]


def test_requests_join_and_leave(target_dir: Path, draft_dir: Path, prompts, reference) -> None:
    """Batch of 3 slots, 16 requests with different max_tokens: slots are reused mid-run."""
    from daemon.runtime.engine.request import Request
    from daemon.runtime.sampling.params import SamplingParams

    engine = make_engine(target_dir, draft_dir, k=4, batch=3)
    lengths = [1 + (i * 7) % MAX_TOKENS for i in range(len(prompts))]
    reqs = [
        Request(f"r{i}", p, SamplingParams(max_tokens=n, ignore_eos=True))
        for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
    ]
    outputs = engine.generate(reqs)
    for out, ref, n in zip(outputs, reference, lengths, strict=True):
        assert out.token_ids == ref[:n]
        assert out.finish_reason == "length"


def test_a_vanishing_temperature_decodes_greedily(
    target_dir: Path, draft_dir: Path, prompts, reference
) -> None:
    """T = 1e-154 (found by the server's fuzz test): greedy, where dividing the logits by it
    once overflowed the drafter's probabilities into NaN."""
    from daemon.runtime.engine.request import Request
    from daemon.runtime.sampling.params import SamplingParams

    engine = make_engine(target_dir, draft_dir, k=4)
    params = SamplingParams(temperature=1.2249270320809242e-154, max_tokens=MAX_TOKENS,
                            ignore_eos=True)  # fmt: skip
    outputs = engine.generate(Request(f"r{i}", p, params) for i, p in enumerate(prompts[:4]))
    assert _tokens(outputs) == reference[:4]
