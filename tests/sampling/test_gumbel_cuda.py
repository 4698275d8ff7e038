"""The Gumbel field's torch search on a GPU: the same tokens as the dense argmax over the field
(computed on the CPU in float64) at the vocabulary sizes of real models, for logits with and
without a noise scale, probabilities, exclusions and the top-k race. The CPU suite checks the
same definition through the C search and torch's CPU kernels (test_gumbel_field.py)."""

import pytest
import torch
from gumbel_cases import dense_argmax_case

from daemon.runtime.sampling.gumbel_field import dense_field, field_keys, gumbel_argmax, gumbel_topk

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("vocab", [1000, 32_000, 151_936])
@pytest.mark.parametrize("are_probs", [False, True])
def test_the_cuda_search_is_the_dense_argmax(vocab: int, are_probs: bool) -> None:
    case = dense_argmax_case(vocab, rows=16, are_probs=are_probs, seed=vocab + are_probs)
    got = gumbel_argmax(
        case.scores.cuda(), case.keys.cuda(), case.excluded.cuda(), are_probs=are_probs
    )
    assert got.is_cuda
    assert got.cpu().tolist() == case.expected.tolist()


@pytest.mark.parametrize("vocab", [32_000, 151_936])
def test_the_cuda_top_k_race_with_a_noise_scale_is_the_dense_ranking(vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    rows, num = 12, 32
    logits = torch.randn(rows, vocab, generator=gen) * 3  # [R, V]
    scale = 0.3 + 1.2 * torch.rand(rows, generator=gen)  # [R]
    keys = field_keys(list(range(rows)), [5 * r for r in range(rows)])
    total = logits.double() + scale.double().unsqueeze(-1) * dense_field(keys, vocab)
    got = gumbel_topk(logits.cuda(), keys.cuda(), num, noise_scale=scale.cuda())
    assert got.cpu().tolist() == total.topk(num, dim=-1).indices.tolist()
    first = gumbel_argmax(logits.cuda(), keys.cuda(), noise_scale=scale.cuda())
    assert first.cpu().tolist() == got[:, 0].cpu().tolist()
