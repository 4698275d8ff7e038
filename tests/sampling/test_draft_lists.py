"""A draft step's listed proposals in one C call (sampling/draft_lists.py) give what the
separate calls give: the same tokens, lists, counts, tails and widened rows."""

import math

import pytest
import torch

from daemon.runtime.model import native
from daemon.runtime.proposers import draft_sampling
from daemon.runtime.proposers.draft_sampling import DraftSampler, RowKey
from daemon.runtime.sampling import block_maxima
from daemon.runtime.sampling.draft_lists import draft_lists
from daemon.runtime.sampling.quantized import PROPOSAL_TOTAL

pytestmark = pytest.mark.skipif(
    native.kernels() is None, reason="the native kernels are not built or do not run here"
)


def _rows(vocab: int, num: int, seed: int) -> tuple[torch.Tensor, list[RowKey]]:
    """Rows of logits from peaked to flat, with the awkward ones: a flat row (one bin holds
    every token), a truncated one (-inf on every other token), exact ties."""
    gen = torch.Generator().manual_seed(seed)
    scale = 0.3 + 6 * torch.rand(num, 1, generator=gen)
    logits = torch.randn(num, vocab, generator=gen) * scale  # [A, V]
    logits[1] = 0.5
    logits[2, ::2] = -math.inf
    logits[3, :40] = logits[3].max() + 1.0  # 40 tied best tokens
    keys = []
    for r in range(num):
        temperature = float(0.3 + 1.2 * torch.rand(1, generator=gen))
        mass = [0.0, 0.5, 0.9, 0.99, 1.0][r % 5]
        keys.append(RowKey(temperature, 1000 * seed + 7 * r, 3 + 11 * r, mass))
    return logits, keys


def _sample_both(
    sampler_args: dict, logits: torch.Tensor, keys: list[RowKey], monkeypatch: pytest.MonkeyPatch
) -> tuple[list, list, int, int]:
    fused = DraftSampler(**sampler_args)
    ran: list[bool] = []

    def spy(*args: object) -> object:
        found = draft_lists(*args)  # type: ignore[arg-type]
        ran.append(found is not None)
        return found

    with monkeypatch.context() as patch:
        patch.setattr(draft_sampling, "draft_lists", spy)
        got = fused._sample_rows(logits, keys)
    assert ran == [True]  # the one C call drafted these rows
    with monkeypatch.context() as patch:  # the separate calls: the fast path declines
        patch.setattr(draft_sampling, "draft_lists", lambda *args: None)
        separate = DraftSampler(**sampler_args)
        want = separate._sample_rows(logits, keys)
    return got, want, fused.num_widened_rows, separate.num_widened_rows


def _assert_same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for (token, sparse), (want_token, want_sparse) in zip(got, want, strict=True):
        assert token == want_token
        assert sparse.tail == want_sparse.tail and sparse.from_tail == want_sparse.from_tail
        # the lists may be padded to different widths (padding: id 0, count 0)
        n = min(len(sparse.ids), len(want_sparse.ids))
        assert torch.equal(sparse.counts[:n], want_sparse.counts[:n])
        assert torch.equal(sparse.ids[:n], want_sparse.ids[:n])
        for longer in (sparse, want_sparse):
            assert (longer.counts[n:] == 0).all() and (longer.ids[n:] == 0).all()
        assert int(sparse.counts.sum()) + sparse.tail == PROPOSAL_TOTAL


LISTS = [(32, 32), (32, 2048), (4, 64), (1, 700)]  # (top, max_listed)
# every list width at small vocabularies, with the LM head's maxima and without; a real
# vocabulary once per width but the last, with maxima (as the runner has them)
CASES = [(v, *lists, maxima) for v in (4096, 3000) for lists in LISTS for maxima in (False, True)]
CASES += [(151_936, *lists, True) for lists in LISTS[:3]]


@pytest.mark.parametrize(("vocab", "top", "max_listed", "maxima"), CASES)
def test_one_call_gives_what_the_separate_calls_give(
    vocab: int, top: int, max_listed: int, maxima: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    logits, keys = _rows(vocab, 12, seed=vocab + top + max_listed)
    if maxima:  # as the LM head leaves them
        full = vocab // 64 * 64
        bmax = logits[:, :full].reshape(12, -1, 64).amax(dim=-1)
        if full < vocab:
            bmax = torch.cat([bmax, logits[:, full:].amax(dim=-1, keepdim=True)], dim=-1)
        block_maxima.remember(logits, bmax.contiguous())
    try:
        got, want, widened, want_widened = _sample_both(
            {"sparse_top_k": top, "max_listed": max_listed}, logits, keys, monkeypatch
        )
    finally:
        block_maxima.forget(logits)
    _assert_same(got, want)
    assert widened == want_widened
    if max_listed > top:
        assert widened > 0  # some rows did widen (the test covers both kinds)


def test_every_seed_and_position_draws_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many draws over the same rows: the keyed draw in C is keyed_random's."""
    logits, keys = _rows(4096, 8, seed=5)
    for trial in range(40):
        moved = [RowKey(k.temperature, k.draft_seed + trial, k.position + 3 * trial,
                        k.listing_mass) for k in keys]  # fmt: skip
        got, want, _, _ = _sample_both(
            {"sparse_top_k": 32, "max_listed": 2048}, logits, moved, monkeypatch
        )
        _assert_same(got, want)


def test_rows_are_padded_to_the_widest_list_only() -> None:
    logits, keys = _rows(4096, 6, seed=11)
    logits[4] = torch.randn(4096, generator=torch.Generator().manual_seed(1))  # not peaked
    temps = [k.temperature for k in keys]
    found = draft_lists(
        logits, temps, [k.draft_seed for k in keys], [k.position for k in keys],
        [0.0, 0.0, 0.0, 0.0, 0.9, 0.0], 8, 1024,
    )  # fmt: skip
    assert found is not None
    assert found.num_widened == 1
    width = found.ids.shape[1]
    assert 8 < width <= 1024
    for r in range(6):
        n = width if r == 4 else 8
        assert (found.counts[r, n:] == 0).all() and (found.ids[r, n:] == 0).all()
        assert (found.excluded[r, n:] == -1).all()
        kept = found.counts[r, :n] > 0
        assert torch.equal(found.excluded[r, :n][kept], found.ids[r, :n][kept])
        assert int(found.counts[r].sum()) + found.tails[r] == PROPOSAL_TOTAL


def test_rows_it_cannot_take_are_left_to_the_separate_calls() -> None:
    logits, keys = _rows(4096, 4, seed=2)
    temps = [k.temperature for k in keys]
    seeds, positions, masses = [k.draft_seed for k in keys], [k.position for k in keys], [0.0] * 4
    assert draft_lists(logits, temps, seeds, positions, masses, 32, 2048) is not None
    with_nan, no_finite = logits.clone(), logits.clone()
    with_nan[1, 5] = math.nan
    no_finite[1] = -math.inf
    for broken in (with_nan, no_finite):
        assert draft_lists(broken, temps, seeds, positions, masses, 32, 2048) is None
    # a base list longer than the blocks (the C top-k's limit), non-float32 rows
    assert draft_lists(logits, temps, seeds, positions, masses, 65, 2048) is None
    assert draft_lists(logits.double(), temps, seeds, positions, masses, 32, 64) is None


def test_a_bad_temperature_or_position_is_a_clear_error() -> None:
    logits, keys = _rows(4096, 4, seed=3)
    logits, keys = logits[:2], keys[:2]
    seeds = [k.draft_seed for k in keys]
    with pytest.raises(ValueError, match="row 1: temperature must be > 0"):
        draft_lists(logits, [0.7, 0.0], seeds, [1, 2], [0.0, 0.0], 32, 64)
    with pytest.raises(ValueError, match="row 1: position -4 < 0"):
        draft_lists(logits, [0.7, 0.7], seeds, [1, -4], [0.0, 0.0], 32, 64)


def test_seeds_of_any_size_are_taken_modulo_2_64(monkeypatch: pytest.MonkeyPatch) -> None:
    """A remote peer's seed is a uint64 on the wire: past 2^63 the one call still runs and
    draws what keyed_random draws (its arithmetic is modulo 2^64)."""
    logits, keys = _rows(4096, 4, seed=8)
    big = [RowKey(k.temperature, (1 << 63) + 977 * r, k.position, k.listing_mass)
           for r, k in enumerate(keys)]  # fmt: skip
    got, want, _, _ = _sample_both({"sparse_top_k": 8, "max_listed": 512}, logits, big, monkeypatch)
    _assert_same(got, want)


def test_a_bad_list_is_a_clear_error() -> None:
    logits = _rows(4096, 4, seed=3)[0][:2]
    with pytest.raises(ValueError, match="temperatures: need 2 items"):
        draft_lists(logits, [0.7], [1, 2], [1, 2], [0.0, 0.0], 32, 64)
    with pytest.raises(TypeError, match="seeds: item 1: "):
        draft_lists(logits, [0.7, 0.7], [1, None], [1, 2], [0.0, 0.0], 32, 64)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="targets: item 0: "):
        draft_lists(logits, [0.7, 0.7], [1, 2], [1, 2], ["x", 0.0], 32, 64)  # type: ignore[list-item]
