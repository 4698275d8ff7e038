"""Per-request randomness: a seed reproduces a request's draws whatever shares its batch."""

import pytest
import torch

from daemon.runtime.sampling.random import (
    UNUSED_UNIFORM,
    emit_uniforms,
    make_generators,
    sample_sparse,
    uniform_noise,
)
from daemon.runtime.sampling.rejection import rejection_sample

VOCAB = 10


def draw(seeds: list[int | None], num_draft: list[int]):
    gens = [None if s is None else g for s, g in zip(seeds, make_generators(seeds), strict=True)]
    max_k = max(num_draft, default=0)
    uniform = uniform_noise(gens, num_draft, max_k)  # [B, K]
    emit = emit_uniforms(gens)  # [B]
    ids = torch.arange(VOCAB).expand(len(seeds), -1)
    probs = torch.full((len(seeds), VOCAB), 1 / VOCAB)
    return uniform, emit, sample_sparse(ids, probs, gens)


def test_same_seeds_same_draws() -> None:
    first, second = draw([1, 2, 3], [2, 0, 3]), draw([1, 2, 3], [2, 0, 3])
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    other = draw([4, 2, 3], [2, 0, 3])
    assert first[1][0] != other[1][0]


def test_draws_do_not_depend_on_batch_neighbours() -> None:
    alone_u, alone_e, alone_s = draw([7], [3])
    u, e, s = draw([11, 7, None], [1, 3, 2])
    assert torch.equal(u[1], alone_u[0])
    assert torch.equal(e[1], alone_e[0])
    assert s[1] == alone_s[0]


def test_greedy_rows_get_filler_and_unused_entries_are_filled() -> None:
    u, e, _ = draw([5, None], [1, 3])
    assert (u[1] == UNUSED_UNIFORM).all() and e[1] == UNUSED_UNIFORM
    assert (u[0, 1:] == UNUSED_UNIFORM).all()
    assert ((u[0, :1] >= 0) & (u[0, :1] < 1)).all()
    assert e.dtype == torch.float64 and 0 < e[0] < 1


def test_empty_batch_shapes() -> None:
    assert uniform_noise([], [], 0).shape == (0, 0)
    assert emit_uniforms([]).shape == (0,)


def test_bad_lengths_raise() -> None:
    gens = make_generators([1, 2])
    with pytest.raises(ValueError):
        uniform_noise(gens, [1], 1)
    with pytest.raises(ValueError):
        uniform_noise(gens, [1, 3], 2)


def test_rejection_output_reproducible_across_batches() -> None:
    """A sampled request verified alone or beside others emits the same tokens."""
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(3, 4, VOCAB, generator=gen), -1)  # [B, K+1, V]
    drafts = torch.randint(0, VOCAB, (3, 3), generator=gen)

    def verify(rows: list[int], seeds: list[int]) -> torch.Tensor:
        gens = make_generators(seeds)
        out, _ = rejection_sample(
            drafts[rows],
            torch.full((len(rows),), 3),
            None,
            None,
            probs[rows],
            torch.zeros(len(rows), dtype=torch.bool),
            uniform_noise(gens, [3] * len(rows), 3),
            emit_uniforms(gens),
        )
        return out

    alone = verify([1], [42])
    assert torch.equal(verify([0, 1, 2], [5, 42, 6])[1], alone[0])
    assert torch.equal(verify([1], [42]), alone)
