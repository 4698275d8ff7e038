"""The inverse-CDF sampler: exact frequencies over several vocabulary blocks, zero-weight
tokens never chosen, the float64 CDF at a real vocabulary size."""

import pytest
import torch
from test_rejection_distribution import MIN_P_VALUE, chi_square_p

from daemon.runtime.sampling.inverse_cdf import BLOCK, sample_inverse_cdf


def test_frequencies_follow_weights_across_blocks() -> None:
    gen = torch.Generator().manual_seed(0)
    vocab = BLOCK + 300  # a full block and a partial one
    weights = torch.rand(vocab, generator=gen) ** 4  # uneven
    weights[::5] = 0.0
    weights[BLOCK : BLOCK + 50] *= 40  # mass concentrated in the last block
    num = 100_000
    uniform = torch.rand(num, generator=gen, dtype=torch.float64)
    tokens = torch.cat(
        [
            sample_inverse_cdf(weights.expand(20_000, -1), uniform[i : i + 20_000])
            for i in range(0, num, 20_000)
        ]
    )
    assert chi_square_p(tokens, weights) > MIN_P_VALUE  # also fails on any zero-weight token


def test_cdf_edges_pick_the_next_token_with_mass() -> None:
    weights = torch.tensor([[0.0, 0.25, 0.0, 0.0, 0.75, 0.0]])
    for u, token in ((0.0, 1), (0.2499, 1), (0.25, 4), (0.9999, 4)):
        assert sample_inverse_cdf(weights, torch.tensor([u], dtype=torch.float64)).item() == token


def test_real_vocabulary_tail_tokens_keep_their_mass() -> None:
    """At V = 151,936 a float32 prefix sum would drift by more than one near-uniform token's
    mass; the float64 two-level sum finds the exact token at the far end of the vocabulary."""
    vocab = 151_936
    weights = torch.full((1, vocab), 1.0 / vocab)
    for index in (0, 1, vocab // 2, vocab - 2, vocab - 1):
        u = torch.tensor([(index + 0.5) / vocab], dtype=torch.float64)
        assert sample_inverse_cdf(weights, u).item() == index


def test_rows_sample_independently_and_shapes_are_checked() -> None:
    weights = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 2.0]])
    out = sample_inverse_cdf(weights, torch.tensor([0.7, 0.1], dtype=torch.float64))
    assert out.tolist() == [0, 2]
    assert sample_inverse_cdf(torch.empty(0, 3), torch.empty(0, dtype=torch.float64)).shape == (0,)
    with pytest.raises(ValueError, match="weights"):
        sample_inverse_cdf(weights, torch.zeros(3, dtype=torch.float64))
