"""A Gumbel-race case shared by the CPU and CUDA searches' tests: rows of scores with the
awkward rows a search must get right, exclusions, field keys, and the token the dense argmax
over the field picks (computed in float64)."""

import math
from dataclasses import dataclass

import torch

from daemon.runtime.sampling.gumbel_field import dense_field, field_keys


@dataclass(slots=True)
class ArgmaxCase:
    scores: torch.Tensor  # [R, V] float32 logits, or probabilities when are_probs
    keys: torch.Tensor  # [R] int64 field keys
    excluded: torch.Tensor  # [R, 8] int64 token ids, entries < 0 unused
    expected: torch.Tensor  # [R] int64 the dense argmax, -1 where no token is left


def dense_argmax_case(vocab: int, rows: int, are_probs: bool, seed: int) -> ArgmaxCase:
    """Row 3 is truncated (every other score -inf); row 4 has one finite score, which it
    excludes, so its answer is -1."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * torch.rand(rows, 1, generator=gen) * 6
    logits[3, ::2] = -math.inf
    logits[4] = -math.inf
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
    return ArgmaxCase(scores, keys, excluded, expected)
