"""Keyed draft randomness and quantised sparse proposals: exact, deterministic, uniform."""

import itertools
from fractions import Fraction

import pytest
import scipy.stats
import torch

from daemon.runtime.sampling.keyed_random import (
    draft_seed_for,
    keyed_draw,
    keyed_u64,
    mix64,
)
from daemon.runtime.sampling.quantized import (
    PROPOSAL_BITS,
    PROPOSAL_TOTAL,
    counts_to_probs,
    quantize_counts,
    sample_from_counts,
)


def test_splitmix64_reference_values() -> None:
    # SplitMix64 seeded with 0: its first outputs are published reference values
    assert keyed_u64(0, 0) == 0xE220A8397B1DCDAF
    assert keyed_u64(0, 1) == 0x6E789E6AA1B965F4
    assert keyed_u64(0, 2) == 0x06C45D188009454F
    assert mix64(0) == 0


def test_draws_are_a_function_of_seed_and_position_only() -> None:
    assert keyed_draw(42, 1000, 15) == keyed_draw(42, 1000, 15)
    assert len({keyed_draw(42, p, 15) for p in range(64)}) > 60  # positions differ
    assert keyed_draw(42, 7, 15) != keyed_draw(43, 7, 15)
    assert draft_seed_for(5) == draft_seed_for(5) != draft_seed_for(6)
    assert draft_seed_for(None) != draft_seed_for(None)
    with pytest.raises(ValueError):
        keyed_u64(1, -1)


def test_draws_are_uniform() -> None:
    draws = torch.tensor([keyed_draw(99, p, PROPOSAL_BITS) for p in range(40_000)])
    assert int(draws.min()) >= 0 and int(draws.max()) < PROPOSAL_TOTAL
    counts = torch.bincount(draws // (PROPOSAL_TOTAL // 64), minlength=64)
    assert scipy.stats.chisquare(counts.numpy()).pvalue > 1e-3


def _rounded_running_sums(probs: list[float]) -> list[int]:
    """Reference: exact rational arithmetic; counts are the differences of the running sums
    scaled to N and rounded half up."""
    exact = [Fraction(p) for p in probs]
    total = sum(exact)
    running, rounded = Fraction(0), [0]
    for e in exact:
        running += e
        rounded.append(int(running / total * PROPOSAL_TOTAL + Fraction(1, 2)))
    return [b - a for a, b in itertools.pairwise(rounded)]


@pytest.mark.parametrize("width", [32, 3000])
def test_quantize_rounds_the_running_sums_summing_to_n(width: int) -> None:
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(20, width, generator=gen) * 3, dim=-1)
    probs = probs.sort(dim=-1, descending=True).values
    counts = quantize_counts(probs)
    assert counts.dtype == torch.int64
    assert bool((counts.sum(dim=-1) == PROPOSAL_TOTAL).all())
    scaled = probs.double() / probs.double().sum(-1, keepdim=True) * PROPOSAL_TOTAL
    assert bool(((counts - scaled).abs() < 1.0).all())  # every count within one of N q
    assert bool((counts[scaled >= 1.0] >= 1).all())  # and one worth a count keeps one
    for row in range(0, probs.shape[0], 5):
        assert counts[row].tolist() == _rounded_running_sums(probs[row].double().tolist())
    # q = count / N is exact in float32
    assert torch.equal(counts_to_probs(counts).double() * PROPOSAL_TOTAL, counts.double())


def test_quantize_ties_and_tiny_mass() -> None:
    counts = quantize_counts(torch.tensor([[1 / 3, 1 / 3, 1 / 3], [1 - 1e-9, 1e-9, 0.0]]))
    assert counts[0].tolist() == [10923, 10922, 10923]  # 10922.67, 21845.33, 32768 rounded
    assert counts[1].tolist() == [PROPOSAL_TOTAL, 0, 0]  # too small to keep: dropped


def test_sampling_from_counts_is_exact() -> None:
    """Every draw value maps to a token: counting over all 2^15 draws gives the counts back."""
    counts = torch.tensor([[20000, 0, 12000, 768], [PROPOSAL_TOTAL, 0, 0, 0]])
    for row in range(2):
        draws = torch.arange(PROPOSAL_TOTAL)
        picks = sample_from_counts(counts[row].expand(PROPOSAL_TOTAL, -1), draws)
        assert torch.bincount(picks, minlength=4).tolist() == counts[row].tolist()
    with pytest.raises(ValueError):
        sample_from_counts(counts, torch.tensor([0, PROPOSAL_TOTAL]))
