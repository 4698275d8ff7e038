"""The Gumbel field's torch search on a GPU: the same tokens as the dense argmax over the field
(computed on the CPU in float64) at the vocabulary sizes of real models, for logits with and
without a noise scale, probabilities, exclusions and the top-k race. The CPU suite checks the
same definition through the C search and torch's CPU kernels (test_gumbel_field.py)."""

import math

import pytest
import torch

from daemon.runtime.sampling.gumbel_field import dense_field, field_keys, gumbel_argmax, gumbel_topk

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("vocab", [1000, 32_000, 151_936])
@pytest.mark.parametrize("are_probs", [False, True])
def test_the_cuda_search_is_the_dense_argmax(vocab: int, are_probs: bool) -> None:
    gen = torch.Generator().manual_seed(vocab + are_probs)
    rows = 16
    logits = torch.randn(rows, vocab, generator=gen) * torch.rand(rows, 1, generator=gen) * 6
    logits[3, ::2] = -math.inf  # a truncated row
    logits[4] = -math.inf  # nothing left but one token, which row 4 excludes
    logits[4, vocab // 2] = 0.0
    excluded = torch.randint(0, vocab, (rows, 8), generator=gen)
    excluded[:, 6:] = -1
    excluded[4, 0] = vocab // 2
    keys = field_keys(list(range(rows)), [vocab + r for r in range(rows)])
    scores = torch.softmax(logits, -1) if are_probs else logits.clone()
    reference = scores.double().log() if are_probs else scores.double()
    for r in range(rows):
        reference[r, excluded[r][excluded[r] >= 0]] = -math.inf
    total = reference + dense_field(keys, vocab)  # [R, V] float64
    expected = torch.where(total.amax(-1) > -math.inf, total.argmax(-1), -1)
    got = gumbel_argmax(scores.cuda(), keys.cuda(), excluded.cuda(), are_probs=are_probs)
    assert got.is_cuda
    assert got.cpu().tolist() == expected.tolist()


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
