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


def test_engines_over_one_loaded_pair_in_their_own_slots(
    target_dir: Path, draft_dir: Path, prompts, reference
) -> None:
    """Two engines over the same loaded target and draft, each in its own range of KV-cache
    slots, stepped in turn with both batches live (as the bench runs its configurations):
    each decodes exactly what one engine alone does. A range past the models' slots is
    refused, saying which."""
    from daemon.runtime.engine.config import EngineConfig
    from daemon.runtime.engine.engine import SpecEngine
    from daemon.runtime.engine.request import Request
    from daemon.runtime.errors import RequestError
    from daemon.runtime.proposers.draft_model import DraftModelProposer
    from daemon.runtime.sampling.params import SamplingParams

    shared = make_engine(target_dir, draft_dir, k=4, batch=8)
    target, draft = shared.target, shared.proposer.model  # type: ignore[union-attr]

    def engine(k: int, first_slot: int) -> SpecEngine:
        proposer = DraftModelProposer(draft) if k else None
        config = EngineConfig(max_batch_size=4, num_speculative_tokens=k)
        return SpecEngine(target, proposer, config, first_slot=first_slot)

    pair = [engine(0, 0), engine(4, 4)]
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    for e in pair:
        for i, prompt in enumerate(prompts[:4]):
            e.add_request(Request(f"r{i}", prompt, params))
    done: list[dict[str, list[int]]] = [{}, {}]
    while any(e.has_unfinished() for e in pair):
        for e, out in zip(pair, done, strict=True):
            if e.has_unfinished():
                out.update((o.request_id, o.token_ids) for o in e.step().finished)
            assert {s.slot for s in e.scheduler.running} <= set(
                range(e.scheduler.first_slot, e.scheduler.first_slot + 4)
            )
    for out in done:
        assert [out[f"r{i}"] for i in range(4)] == reference[:4]
    with pytest.raises(RequestError, match="max batch size 4 from slot 6 exceeds the model's 8"):
        engine(0, 6)
