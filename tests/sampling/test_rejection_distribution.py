"""Statistical tests: speculative sampling reproduces the target's distribution.

A two-token draft (x0 ~ q0, x1 ~ Q1[x0]) is verified against a target that is conditional like a
real model (p0, then P1[x0], then the bonus P2[x1]). The first emitted token must follow p0 and
the first two emitted tokens must follow p0(a) * P1[a, b]; when only one token is emitted the
second is drawn from P1[t0] as the next round would. 20000 rows, one seed per row, through the
real noise API. Chi-square with p > 1e-3 on seeded data (deterministic); a power check shows
the same test rejects the draft's own tokens.
"""

import pytest
import scipy.stats
import torch

from daemon.runtime.sampling.gumbel_field import field_keys, gumbel_argmax
from daemon.runtime.sampling.inverse_cdf import sample_inverse_cdf
from daemon.runtime.sampling.logits import process_logits, sparse_top_k
from daemon.runtime.sampling.random import (
    emit_uniforms,
    make_generators,
    sample_sparse,
    uniform_noise,
)
from daemon.runtime.sampling.rejection import rejection_sample

VOCAB = 12
NUM_ROWS = 20_000
MIN_P_VALUE = 1e-3


def chi_square_p(samples: torch.Tensor, expected: torch.Tensor) -> float:
    """samples [N] cell ids; expected [C] probabilities. Cells with expected count < 5 are
    pooled; a sample in a zero-probability cell fails outright."""
    counts = torch.bincount(samples, minlength=expected.numel()).double()
    assert counts[expected == 0].sum() == 0, "sampled a token the target forbids"
    expected_counts = expected.double() / expected.sum() * samples.numel()
    small = expected_counts < 5
    obs = torch.cat([counts[~small], counts[small].sum().view(1)])
    exp = torch.cat([expected_counts[~small], expected_counts[small].sum().view(1)])
    keep = exp > 0
    exp = exp * obs.sum() / exp[keep].sum()  # exact totals for scipy's consistency check
    return float(scipy.stats.chisquare(obs[keep].numpy(), exp[keep].numpy()).pvalue)


def target_tables(gen: torch.Generator, truncate: bool) -> tuple[torch.Tensor, ...]:
    """p0 [V], P1 [V, V] (row = previous token), P2 [V, V]; optionally top-k/top-p truncated."""
    logits = torch.randn(1 + 2 * VOCAB, VOCAB, generator=gen) * 1.5
    rows = logits.shape[0]
    top_k = torch.full((rows,), 5 if truncate else 0, dtype=torch.long)
    top_p = torch.full((rows,), 0.8 if truncate else 1.0)
    probs = process_logits(logits, torch.full((rows,), 0.9), top_k, top_p)
    return probs[0], probs[1 : 1 + VOCAB], probs[1 + VOCAB :]


def draft_tables(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """q0 [V], Q1 [V, V]: deliberately different from the target."""
    logits = torch.randn(1 + VOCAB, VOCAB, generator=gen) * 1.5
    probs = torch.softmax(logits, dim=-1)
    return probs[0], probs[1:]


def speculate(mode: str, num_sparse: int, truncate: bool, seed: int):
    """Runs one verify round over NUM_ROWS independent rows; returns (t0, t1, x0) [N] each."""
    gen = torch.Generator().manual_seed(seed)
    p0, p1, p2 = target_tables(gen, truncate)
    q0, q1 = draft_tables(gen)
    gens = make_generators([seed * NUM_ROWS + row for row in range(NUM_ROWS)])
    ids0, sp0 = sparse_top_k(q0.expand(NUM_ROWS, -1), num_sparse)  # [N, S]
    sparse_tail = position_keys = None
    if mode == "point":  # greedy draft: point masses on the draft's argmax
        x0 = ids0[:, 0]
        x1 = q1[x0].argmax(-1)
        sparse_ids = sparse_probs = None
    elif mode == "tail":  # top-S with their own probabilities, the rest as a tail
        position_keys = torch.stack([field_keys(list(range(NUM_ROWS)), [seed * 2 + j] * NUM_ROWS)
                                 for j in range(2)], dim=1)  # [N, 2]  # fmt: skip
        ids0, sp0, tail0, x0 = draft_with_tail(q0.expand(NUM_ROWS, -1), num_sparse,
                                               position_keys[:, 0], gens)  # fmt: skip
        ids1, sp1, tail1, x1 = draft_with_tail(q1[x0], num_sparse, position_keys[:, 1], gens)
        sparse_ids, sparse_probs = torch.stack([ids0, ids1], 1), torch.stack([sp0, sp1], 1)
        sparse_tail = torch.stack([tail0, tail1], 1)
    else:
        x0 = sample_sparse(ids0, sp0, gens)
        ids1, sp1 = sparse_top_k(q1[x0], num_sparse)
        x1 = sample_sparse(ids1, sp1, gens)
        sparse_ids, sparse_probs = torch.stack([ids0, ids1], 1), torch.stack([sp0, sp1], 1)
    out, num = rejection_sample(
        torch.stack([x0, x1], dim=1),
        torch.full((NUM_ROWS,), 2),
        sparse_ids,
        sparse_probs,
        torch.stack([p0.expand(NUM_ROWS, -1), p1[x0], p2[x1]], dim=1),  # [N, 3, V]
        torch.zeros(NUM_ROWS, dtype=torch.bool),
        uniform_noise(gens, [2] * NUM_ROWS, 2),
        emit_uniforms(gens),
        sparse_tail,
        position_keys,
    )
    t0 = out[:, 0]
    # one token emitted: the next round samples t1 from P1[t0]
    next_token = sample_inverse_cdf(p1[t0], emit_uniforms(gens))
    t1 = torch.where(num >= 2, out[:, 1], next_token)
    return t0, t1, x0, p0, p1


def draft_with_tail(
    q: torch.Tensor, num_sparse: int, keys: torch.Tensor, gens: list[torch.Generator | None]
) -> tuple[torch.Tensor, ...]:
    """Drafts as the draft sampler does: q [N, V] -> its top-S ids and probabilities [N, S]
    (not renormalised), the tail mass [N] and the draft tokens [N]: a listed token with its
    probability, else the tail, whose token is the Gumbel-max of q over the unlisted ones
    with the position's field (keys [N])."""
    probs, ids = q.topk(num_sparse, dim=-1)
    tail = (1.0 - probs.sum(-1)).clamp(min=0.0)
    with_marker = torch.cat([ids, torch.full_like(ids[:, :1], VOCAB)], dim=-1)  # V: the tail
    choice = sample_sparse(with_marker, torch.cat([probs, tail.unsqueeze(-1)], -1), gens)
    unlisted = gumbel_argmax(q.clone(), keys, ids, are_probs=True)
    return ids, probs, tail, torch.where(choice == VOCAB, unlisted, choice)


CASES = {
    "full_support": ("sparse", VOCAB, False),
    "top3_and_tail": ("tail", 3, False),
    "sparse_top4": ("sparse", 4, False),
    "point_mass": ("point", 1, False),
    "truncated_target": ("sparse", 6, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_emitted_tokens_follow_target(case: str) -> None:
    mode, num_sparse, truncate = CASES[case]
    t0, t1, x0, p0, p1 = speculate(mode, num_sparse, truncate, seed=len(case))
    if mode == "sparse" and not truncate:
        # power: the same test rejects the draft tokens themselves (q0 != p0), so the
        # sample is large enough to see the difference the sampler corrects
        assert chi_square_p(x0, p0) < MIN_P_VALUE
    assert chi_square_p(t0, p0) > MIN_P_VALUE
    # joint of the first two tokens: cell a * V + b has probability p0[a] * P1[a, b]
    joint = (p0.unsqueeze(-1) * p1).flatten()
    assert chi_square_p(t0 * VOCAB + t1, joint) > MIN_P_VALUE


def test_sample_sparse_follows_sparse_distribution() -> None:
    probs = torch.softmax(torch.randn(VOCAB, generator=torch.Generator().manual_seed(5)), -1)
    ids, sparse = sparse_top_k(probs.expand(NUM_ROWS, -1), 5)
    tokens = sample_sparse(ids, sparse, make_generators(list(range(NUM_ROWS))))
    expected = torch.zeros(VOCAB).scatter_(0, ids[0], sparse[0])
    assert chi_square_p(tokens, expected) > MIN_P_VALUE
