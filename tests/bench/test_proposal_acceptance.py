"""The exact per-draft acceptance of a proposal format (bench/proposal_acceptance.py): its
closed form for the Gumbel coupling, and its prediction against the engine's own draft sampler
and rejection sampler drawing thousands of drafts."""

import pytest
import torch

from bench.proposal_acceptance import (
    ProposalFormat,
    coupling_agreement,
    learned_format,
    parse_formats,
    proposal_acceptance,
    round_acceptance_rate,
)
from daemon.runtime.proposers.draft_sampling import DraftSampler, RowKey
from daemon.runtime.proposers.tail_verdicts import SUGGESTED_MAX_LISTED
from daemon.runtime.sampling.gumbel_field import field_keys
from daemon.runtime.sampling.quantized import PROPOSAL_TOTAL
from daemon.runtime.sampling.random import emit_uniforms, make_generators, uniform_noise
from daemon.runtime.sampling.rejection import rejection_sample

VOCAB = 40
NUM_DRAWS = 20_000


def test_coupling_agreement_matches_gumbel_races() -> None:
    gen = torch.Generator().manual_seed(0)
    p = torch.rand(3, 12, generator=gen) ** 3  # [R, V] unnormalised weights
    q = torch.rand(3, 12, generator=gen) ** 3
    p[0, 0] = 0.0  # a token only the draft can pick
    q[1, :4] = 0.0  # tokens only the target can pick
    exact = coupling_agreement(p, q)  # [R]
    gumbel = -torch.log(-torch.log(torch.rand(100_000, 12, generator=gen)))  # [N, V]
    for row in range(3):
        target_pick = (p[row].log() + gumbel).argmax(-1)
        draft_pick = (q[row].log() + gumbel).argmax(-1)
        raced = float((target_pick == draft_pick).double().mean())
        assert abs(raced - float(exact[row])) < 4 * (0.25 / 100_000) ** 0.5 + 1e-3


def test_coupling_agreement_extremes() -> None:
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.5, 0.5, 0.0, 0.0]])
    q = torch.tensor([[5.0, 3.0, 2.0, 0.0], [0.0, 0.0, 0.7, 0.3]])  # the same shape; disjoint
    assert coupling_agreement(p, q).tolist() == pytest.approx([1.0, 0.0])


def test_listing_everything_is_full_drafting_up_to_the_counts() -> None:
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(5, VOCAB, generator=gen), -1)
    q = torch.softmax(torch.randn(5, VOCAB, generator=gen), -1)
    full, listed = proposal_acceptance(p, q, ProposalFormat(0))
    assert full.tolist() == pytest.approx(torch.minimum(p, q).sum(-1).tolist())
    assert listed.tolist() == [float(VOCAB)] * 5
    everything, _ = proposal_acceptance(p, q, ProposalFormat(VOCAB))
    assert (everything - full).abs().max() < VOCAB / PROPOSAL_TOTAL
    few, _ = proposal_acceptance(p, q, ProposalFormat(3))
    assert bool((few < full).all())  # a narrow list loses in the tail's coupling


def test_draft_equal_to_target_is_always_accepted_whatever_is_listed() -> None:
    p = torch.softmax(torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(2)) * 0.3, -1)
    for fmt in (ProposalFormat(1), ProposalFormat(4), ProposalFormat(16, mass=0.5)):
        accept, _ = proposal_acceptance(p, p, fmt)
        assert accept.tolist() == pytest.approx([1.0] * 4, abs=VOCAB / PROPOSAL_TOTAL)


def engine_acceptance(logits_p: torch.Tensor, logits_q: torch.Tensor, width: int) -> float:
    """NUM_DRAWS drafts of one position (one draft seed each) from the engine's draft sampler
    at temperature 1, verified by the engine's rejection sampler against softmax(logits_p);
    the fraction accepted."""
    position = 9
    seeds = list(range(NUM_DRAWS))
    steps = DraftSampler(width).sample(
        logits_q.expand(NUM_DRAWS, -1).clone(),
        [RowKey(1.0, seed, position) for seed in seeds],
        with_alternatives=False,
    )
    ids = torch.stack([s.sparse.ids for s in steps if s.sparse is not None])  # [N, S]
    counts = torch.stack([s.sparse.counts for s in steps if s.sparse is not None])
    tails = torch.tensor([s.sparse.tail for s in steps if s.sparse is not None])  # [N]
    gens = make_generators(seeds)
    p = torch.softmax(logits_p, -1)
    _, num = rejection_sample(
        torch.tensor([[s.token] for s in steps]),  # [N, 1]
        torch.ones(NUM_DRAWS, dtype=torch.long),
        ids.unsqueeze(1),  # [N, 1, S]
        (counts.float() / PROPOSAL_TOTAL).unsqueeze(1),
        p.expand(NUM_DRAWS, 2, -1),  # [N, 2, V]
        torch.zeros(NUM_DRAWS, dtype=torch.bool),
        uniform_noise(gens, [1] * NUM_DRAWS, 1),
        emit_uniforms(gens),
        (tails.float() / PROPOSAL_TOTAL).unsqueeze(1),  # [N, 1]
        field_keys(seeds, [position] * NUM_DRAWS).unsqueeze(1),  # the drafter's field
    )
    return float((num == 2).double().mean())


@pytest.mark.parametrize("width", [2, 8])
def test_prediction_matches_the_engines_sampler_and_verifier(width: int) -> None:
    gen = torch.Generator().manual_seed(3)
    logits_p = torch.randn(VOCAB, generator=gen)
    logits_q = logits_p + 0.8 * torch.randn(VOCAB, generator=gen)
    predicted, _ = proposal_acceptance(
        torch.softmax(logits_p, -1)[None], torch.softmax(logits_q, -1)[None], ProposalFormat(width)
    )
    measured = engine_acceptance(logits_p, logits_q, width)
    assert abs(measured - float(predicted)) < 4 * (0.25 / NUM_DRAWS) ** 0.5


def test_the_learned_format_widens_only_a_costly_tail() -> None:
    gen = torch.Generator().manual_seed(4)
    p = torch.softmax(torch.randn(6, 3000, generator=gen) * 0.5, -1)  # flat: a big tail
    q = torch.softmax(torch.log(p) + 0.5 * torch.randn(6, 3000, generator=gen), -1)
    learned = learned_format(p, q)
    assert learned.widen_to == SUGGESTED_MAX_LISTED and 0.9 < learned.widen_mass < 1.0
    narrow, _ = proposal_acceptance(p, q, ProposalFormat(32))
    widened, listed = proposal_acceptance(p, q, learned)
    assert bool((widened > narrow).all()) and bool((listed > 32).all())
    same = learned_format(p, p)  # draft = target: the tail is always accepted
    assert same.widen_mass == 0.0
    assert proposal_acceptance(p, p, same)[1].tolist() == [32.0] * 6


def test_round_acceptance_rate_compounds_along_a_round() -> None:
    accept = torch.tensor([0.5] * 6 + [1.0] * 6)  # two runs of 6 positions
    # k = 2: a run of 0.5s accepts (0.5 + 0.25) / 2; a run of 1s accepts both
    assert round_acceptance_rate(accept, 6, k=2) == pytest.approx((0.375 + 1.0) / 2)
    with pytest.raises(ValueError, match="cannot hold"):
        round_acceptance_rate(accept, 6, k=7)


def test_parse_formats() -> None:
    assert parse_formats("32, 256:0.95,learned") == [
        ProposalFormat(32),
        ProposalFormat(256, 0.95),
        None,
    ]
    for bad in ("x", "0", "8:1.5", "8:0"):
        with pytest.raises(SystemExit, match="--formats"):
            parse_formats(bad)
