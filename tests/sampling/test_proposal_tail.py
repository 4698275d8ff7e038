"""Proposals with a tail: the top tokens with their own probabilities and the rest of the
draft's mass spread evenly over the other tokens. The draft samples from exactly that
distribution, and at a flat distribution the verifier accepts far more than a top-S-only
proposal lets it."""

import pytest
import torch
from test_rejection_distribution import MIN_P_VALUE, chi_square_p

from daemon.runtime.proposers.draft_sampling import DraftSampler, RowKey
from daemon.runtime.sampling.quantized import (
    PROPOSAL_TOTAL,
    quantize_with_tail,
    unlisted_token,
)
from daemon.runtime.sampling.random import emit_uniforms, make_generators, uniform_noise
from daemon.runtime.sampling.rejection import rejection_sample

VOCAB = 40
NUM_DRAWS = 20_000


def test_quantize_with_tail_sums_to_n_and_keeps_the_tail_mass() -> None:
    probs = torch.tensor([[0.5, 0.2, 0.1], [0.9, 0.1, 0.0], [1e-6, 1e-6, 1e-6]])
    counts, tail = quantize_with_tail(probs)
    assert (counts.sum(-1) + tail == PROPOSAL_TOTAL).all()
    assert abs(int(tail[0]) / PROPOSAL_TOTAL - 0.2) < 1 / PROPOSAL_TOTAL
    assert int(tail[1]) == 0
    assert int(tail[2]) == PROPOSAL_TOTAL  # a flat distribution: everything in the tail


def test_unlisted_token_covers_exactly_the_unlisted_ids() -> None:
    listed = [0, 3, 4, 9]
    n = 10 - len(listed)
    picked = [unlisted_token(listed, 10, -(-(i << 64) // n)) for i in range(n)]  # index i
    assert picked == [1, 2, 5, 6, 7, 8]
    with pytest.raises(ValueError):
        unlisted_token(list(range(5)), 5, 0)


def draft_frequencies(
    logits: torch.Tensor, sparse_top_k: int
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Draws NUM_DRAWS drafts (one per draft seed) from one row of logits [V]; returns the
    tokens, the proposal q [V] the sampler said they came from and its tail mass."""
    sampler = DraftSampler(sparse_top_k)
    keys = [RowKey(1.0, seed, 7) for seed in range(NUM_DRAWS)]
    steps = sampler.sample(logits.expand(NUM_DRAWS, -1).clone(), keys, with_alternatives=False)
    sparse = steps[0].sparse
    assert sparse is not None
    listed = sparse.counts > 0
    q = torch.full((VOCAB,), sparse.tail / PROPOSAL_TOTAL / (VOCAB - int(listed.sum())))
    q[sparse.ids[listed]] = sparse.counts[listed].double().float() / PROPOSAL_TOTAL
    return torch.tensor([s.token for s in steps]), q, sparse.tail / PROPOSAL_TOTAL


def test_draft_sampler_draws_from_the_proposal_it_sends() -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(3)) * 0.7
    tokens, q, tail = draft_frequencies(logits, sparse_top_k=4)
    assert abs(float(q.sum()) - 1.0) < 1e-5
    # the tail holds what the top 4 leave: the draft's own mass outside them
    top4 = torch.softmax(logits, -1).topk(4).values.sum()
    assert abs(tail - float(1 - top4)) <= 1 / PROPOSAL_TOTAL
    assert chi_square_p(tokens, q) > MIN_P_VALUE


def test_flat_draft_equal_to_target_is_accepted_far_more_with_a_tail() -> None:
    """Draft = target, both flat: top-4 alone carries a fraction of the mass and the verifier
    accepts about that fraction; with the tail it accepts sum(min(p, q)), most of it."""
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(VOCAB, generator=gen) * 0.3, -1)  # [V] flat
    top, ids = p.topk(4)
    tail = 1.0 - top.sum()
    q_tail = torch.full((VOCAB,), float(tail) / (VOCAB - 4))
    q_tail[ids] = top
    rates = {}
    for name, probs, tails, q in (
        ("top4", top / top.sum(), None, torch.zeros(VOCAB).scatter(0, ids, top / top.sum())),
        ("top4+tail", top, torch.tensor(float(tail)), q_tail),
    ):
        gens = make_generators(list(range(NUM_DRAWS)))
        drafts = torch.multinomial(q, NUM_DRAWS, replacement=True, generator=gen)  # x ~ q
        _, num = rejection_sample(
            drafts.view(-1, 1),
            torch.ones(NUM_DRAWS, dtype=torch.long),
            ids.expand(NUM_DRAWS, 1, -1),
            probs.expand(NUM_DRAWS, 1, -1),
            p.expand(NUM_DRAWS, 2, -1),
            torch.zeros(NUM_DRAWS, dtype=torch.bool),
            uniform_noise(gens, [1] * NUM_DRAWS, 1),
            emit_uniforms(gens),
            None if tails is None else tails.expand(NUM_DRAWS, 1),
        )
        rates[name] = float((num == 2).double().mean())
        expected = float(torch.minimum(p, q).sum())
        assert abs(rates[name] - expected) < 0.02, (name, rates[name], expected)
    assert rates["top4+tail"] > 0.85 > 0.3 > rates["top4"]
