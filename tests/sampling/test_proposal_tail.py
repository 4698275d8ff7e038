"""Proposals with a tail: the top tokens with their own probabilities and the rest of the
draft's mass as one class, whose token the drafter and the verifier each pick by Gumbel-max
over the unlisted tokens with the position's shared noise field. The drafter draws from its
own distribution (quantised on the listed tokens); at a flat distribution the verifier accepts
far more than a top-S-only proposal lets it, and everything when draft = target."""

import pytest
import torch
from test_rejection_distribution import MIN_P_VALUE, chi_square_p, draft_with_tail

from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.errors import RequestError
from daemon.runtime.proposers.draft_sampling import DraftSampler, RowKey
from daemon.runtime.proposers.drafts import SparseDraw
from daemon.runtime.sampling.gumbel_field import field_keys
from daemon.runtime.sampling.quantized import (
    PROPOSAL_TOTAL,
    quantize_with_tail,
    unlisted_token,
)
from daemon.runtime.sampling.random import (
    emit_uniforms,
    make_generators,
    sample_sparse,
    uniform_noise,
)
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
    tokens, the distribution they should follow [V] (the counts on the listed tokens, the
    tail spread like the draft's own probabilities on the rest) and the tail mass."""
    sampler = DraftSampler(sparse_top_k)
    keys = [RowKey(1.0, seed, 7) for seed in range(NUM_DRAWS)]
    steps = sampler.sample(logits.expand(NUM_DRAWS, -1).clone(), keys, with_alternatives=False)
    sparse = steps[0].sparse
    assert sparse is not None
    q = proposal_shape(torch.softmax(logits, -1), sparse)
    return torch.tensor([s.token for s in steps]), q, sparse.tail / PROPOSAL_TOTAL


def proposal_shape(q: torch.Tensor, sparse: SparseDraw) -> torch.Tensor:
    """q [V] the draft's distribution -> [V] what it draws from with this proposal: the counts
    on the listed tokens, the tail spread like q on the rest."""
    listed = sparse.counts > 0
    shaped = q.clone()
    shaped[sparse.ids[listed]] = 0.0
    shaped = shaped / shaped.sum() * sparse.tail / PROPOSAL_TOTAL
    shaped[sparse.ids[listed]] = sparse.counts[listed].double().float() / PROPOSAL_TOTAL
    return shaped


def test_draft_sampler_draws_from_the_proposal_it_sends() -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(3)) * 0.7
    tokens, q, tail = draft_frequencies(logits, sparse_top_k=4)
    assert abs(float(q.sum()) - 1.0) < 1e-5
    # the tail holds what the top 4 leave: the draft's own mass outside them
    top4 = torch.softmax(logits, -1).topk(4).values.sum()
    assert abs(tail - float(1 - top4)) <= 1 / PROPOSAL_TOTAL
    assert chi_square_p(tokens, q) > MIN_P_VALUE


def accept_rate(p: torch.Tensor, q: torch.Tensor, num_sparse: int, with_tail: bool) -> float:
    """One draft per row, drawn as the draft sampler does (draft_with_tail), verified against
    p [V]; the fraction accepted."""
    gens = make_generators(list(range(NUM_DRAWS)))
    keys = field_keys(list(range(NUM_DRAWS)), [11] * NUM_DRAWS)  # [N]
    ids, probs, tail, drafts = draft_with_tail(q.expand(NUM_DRAWS, -1), num_sparse, keys, gens)
    if not with_tail:  # the listed tokens alone, renormalised
        probs = probs / probs.sum(-1, keepdim=True)
        drafts = sample_sparse(ids, probs, gens)
    _, num = rejection_sample(
        drafts.view(-1, 1),
        torch.ones(NUM_DRAWS, dtype=torch.long),
        ids.unsqueeze(1),
        probs.unsqueeze(1),
        p.expand(NUM_DRAWS, 2, -1),
        torch.zeros(NUM_DRAWS, dtype=torch.bool),
        uniform_noise(gens, [1] * NUM_DRAWS, 1),
        emit_uniforms(gens),
        tail.unsqueeze(1) if with_tail else None,
        keys.unsqueeze(1) if with_tail else None,
    )
    return float((num == 2).double().mean())


def test_flat_draft_equal_to_target_is_accepted_whole_with_a_tail() -> None:
    """Draft = target, both flat: top-4 alone carries a fraction of the mass and the verifier
    accepts about that fraction; with the tail the drafter and the verifier pick the same
    unlisted token from the shared noise, and every draft is accepted."""
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(VOCAB, generator=gen) * 0.3, -1)  # [V] flat
    top4 = float(p.topk(4).values.sum())
    assert abs(accept_rate(p, p, 4, with_tail=False) - top4) < 0.02
    assert accept_rate(p, p, 4, with_tail=True) == 1.0


def test_tail_acceptance_between_the_gumbel_bound_and_the_overlap() -> None:
    """Draft != target: the listed tokens are accepted as in plain rejection sampling, the tail
    at least as often as the Gumbel coupling guarantees and never more than sum(min(p, q))."""
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(VOCAB, generator=gen)
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits + 0.4 * torch.randn(VOCAB, generator=gen), -1)
    rate = accept_rate(p, q, 4, with_tail=True)
    overlap = float(torch.minimum(p, q).sum())
    assert overlap / (2 - overlap) - 0.02 < rate < overlap + 0.02
    assert rate > accept_rate(p, q, 4, with_tail=False) + 0.1


def test_sparse_mass_lists_only_what_covers_it_and_still_draws_what_it_sends() -> None:
    logits = torch.linspace(4.0, -4.0, VOCAB)  # peaked: the first tokens hold most mass
    q = torch.softmax(logits, -1)
    sampler = DraftSampler(sparse_top_k=16, sparse_mass=0.8)
    keys = [RowKey(1.0, seed, 3) for seed in range(NUM_DRAWS)]
    steps = sampler.sample(logits.expand(NUM_DRAWS, -1).clone(), keys, with_alternatives=False)
    sparse = steps[0].sparse
    assert sparse is not None
    num_listed = int((sparse.counts > 0).sum())
    # the fewest best tokens whose mass reaches 0.8
    expected = int((q.cumsum(0) - q < 0.8).sum())
    assert num_listed == expected < 16
    tokens = torch.tensor([s.token for s in steps])
    assert chi_square_p(tokens, proposal_shape(q, sparse)) > MIN_P_VALUE


def test_sparse_mass_out_of_range_is_refused() -> None:
    for mass in (0.0, 1.5):
        with pytest.raises(ValueError, match="sparse_mass"):
            DraftSampler(8, sparse_mass=mass)
        with pytest.raises(RequestError, match="sparse mass"):
            EngineConfig(draft_sparse_mass=mass)


def test_a_short_row_widens_to_cover_the_listing_mass_and_draws_what_it_sends() -> None:
    """A flat row whose best 2 tokens hold little of q lists, when its tail is costly
    (listing_mass 0.9), its best tokens down to where they cover 0.9 (by bins of log q: at
    most one bin more), at most max_listed; the draft still follows the counts it sends."""
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(5)) * 0.8
    q = torch.softmax(logits, -1)
    sampler = DraftSampler(sparse_top_k=2, max_listed=30)
    keys = [RowKey(1.0, seed, 4, listing_mass=0.9) for seed in range(NUM_DRAWS)]
    steps = sampler.sample(logits.expand(NUM_DRAWS, -1).clone(), keys, with_alternatives=False)
    assert sampler.num_widened_rows == NUM_DRAWS
    sparse = steps[0].sparse
    assert sparse is not None
    listed = sparse.counts > 0
    fewest = int((q.sort(descending=True).values.cumsum(0) < 0.9).sum()) + 1
    assert fewest <= int(listed.sum()) <= 30
    assert float(q[sparse.ids[listed]].sum()) >= 0.9
    # every listed token is at least as likely as every unlisted one
    unlisted = torch.ones(VOCAB, dtype=torch.bool)
    unlisted[sparse.ids[listed]] = False
    assert float(q[sparse.ids[listed]].min()) >= float(q[unlisted].max())
    tokens = torch.tensor([s.token for s in steps])
    assert chi_square_p(tokens, proposal_shape(q, sparse)) > MIN_P_VALUE


def test_rows_widen_only_where_the_base_list_leaves_too_much_to_the_tail() -> None:
    peaked = torch.linspace(12.0, -12.0, VOCAB)  # its best 2 hold 0.70 of q
    flat = torch.linspace(0.0, -4.0, VOCAB)  # a token per bin of log q: the cut is exact
    fewest = int((torch.softmax(flat, -1).cumsum(0) < 0.5).sum()) + 1
    sampler = DraftSampler(sparse_top_k=2, max_listed=VOCAB)
    keys = [RowKey(1.0, 1, 3, listing_mass=0.5), RowKey(1.0, 2, 3, listing_mass=0.5)]
    steps = sampler.sample(torch.stack([peaked, flat]), keys, False)
    widths = [int((s.sparse.counts > 0).sum()) for s in steps if s.sparse is not None]
    assert widths == [2, fewest] and fewest > 2  # the fewest best tokens that cover 0.5
    assert sampler.num_widened_rows == 1
    # a row whose tail costs nothing does not widen, beside one that does
    keys[1].listing_mass = 0.0
    steps = sampler.sample(torch.stack([flat, flat]), keys, False)
    assert [int((s.sparse.counts > 0).sum()) for s in steps if s.sparse] == [fewest, 2]
    keys[0].listing_mass = 0.0
    steps = sampler.sample(torch.stack([peaked, flat]), keys, False)
    assert [int((s.sparse.counts > 0).sum()) for s in steps if s.sparse] == [2, 2]
    with pytest.raises(ValueError, match="max_listed"):
        DraftSampler(sparse_top_k=8, max_listed=4)
    with pytest.raises(RequestError, match="max listed"):
        EngineConfig(draft_sparse_top_k=8, draft_sparse_max_listed=4)
