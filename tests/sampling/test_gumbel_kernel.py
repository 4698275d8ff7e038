"""The Triton Gumbel race (gumbel_kernel.py) picks the dense argmax over the field.

Without a GPU the kernel runs under TRITON_INTERPRET=1, which triton reads when a kernel is
decorated; so the launcher test re-runs this file's kernel tests in a fresh process with the
variable set (as test_rejection_kernel.py does). On CUDA, test_gumbel_cuda.py reaches the same
kernel through `gumbel_argmax` at real vocabulary sizes.
"""

import math

import pytest
import torch
from gumbel_cases import dense_argmax_case
from triton_child import is_kernel_child, run_interpreted_child

from daemon.runtime.sampling.gumbel_field import BLOCK, SUPER, dense_field, field_keys

kernel_only = pytest.mark.skipif(not is_kernel_child(), reason="runs in the interpreted child")


@pytest.mark.skipif(is_kernel_child(), reason="this is the child run")
def test_kernel_is_the_dense_argmax_interpreted() -> None:
    run_interpreted_child([__file__], "not interpreted")


def _race(scores: torch.Tensor, rows: torch.Tensor, keys: torch.Tensor, **kwargs) -> list[int]:
    from daemon.runtime.sampling.gumbel_triton import HAS_TRITON, gumbel_race_triton

    assert HAS_TRITON
    return gumbel_race_triton(
        scores, rows, keys, block=BLOCK, super_blocks=SUPER, **kwargs
    ).tolist()


# 1000: one partial superblock; 4096: two whole ones; 5000: three, the last block partial
@kernel_only
@pytest.mark.parametrize("vocab", [1000, 4096, 5000])
@pytest.mark.parametrize("are_probs", [False, True])
def test_kernel_picks_the_dense_argmax(vocab: int, are_probs: bool) -> None:
    case = dense_argmax_case(vocab, rows=8, are_probs=are_probs, seed=vocab + are_probs)
    scores = case.scores.clone()
    for r in range(scores.shape[0]):  # exclusions are masked by gumbel_argmax, not the kernel
        scores[r, case.excluded[r][case.excluded[r] >= 0]] = 0.0 if are_probs else -math.inf
    got = _race(scores, torch.arange(8), case.keys, are_probs=are_probs, noise_scale=None)
    assert got == case.expected.tolist()
    assert -1 in got  # row 4 has nothing left


@kernel_only
def test_kernel_races_the_rows_it_is_given_with_their_noise_scales() -> None:
    vocab = 3000
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(6, vocab, generator=gen) * 3  # [R, V]
    rows = torch.tensor([5, 3, 3, 0])  # a row may race under several keys
    scale = 0.3 + 1.2 * torch.rand(4, generator=gen, dtype=torch.float64)  # [N]
    keys = field_keys([11, 12, 13, 14], [0, 1, 2, 3])
    total = logits.double()[rows] + scale.unsqueeze(-1) * dense_field(keys, vocab)
    got = _race(logits, rows, keys, are_probs=False, noise_scale=scale)
    assert got == total.argmax(dim=-1).tolist()
    # a strided view of wider rows reads the right entries
    wide = torch.full((6, vocab + 37), -math.inf)
    wide[:, :vocab] = logits
    assert _race(wide[:, :vocab], rows, keys, are_probs=False, noise_scale=scale) == got
