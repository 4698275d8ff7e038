"""A listed proposal's counts, the token its draw picks and the ids a tail draw excludes, in
one C call where the native kernels run and in torch elsewhere: the same bits either way
(sampling/quantized.py)."""

import pytest
import torch

from daemon.runtime.model import native
from daemon.runtime.sampling.quantized import (
    PROPOSAL_TOTAL,
    quantize_and_draw,
    quantize_with_tail,
    sample_from_counts,
)

needs_native = pytest.mark.skipif(native.kernels() is None, reason="native kernels not built")


def listed_rows(seed: int) -> torch.Tensor:
    """[24, W] float32 rows like a drafter's lists: softmax tops of peaked to flat logits,
    some covering the whole distribution (no tail), some little of it, widths 1 to 700."""
    gen = torch.Generator().manual_seed(seed)
    width = [1, 3, 32, 700][seed % 4]
    rows = []
    for r in range(24):
        logits = torch.randn(4096, generator=gen, dtype=torch.float64) * (0.05 + r)
        probs = logits.softmax(-1)
        top = torch.topk(probs, width).values
        if r % 6 == 0:  # a whole distribution over `width` tokens: the tail rounds to ~0
            top = top / top.sum()
        rows.append(top.float())
    return torch.stack(rows)


def listed_ids(probs: torch.Tensor, seed: int) -> torch.Tensor:
    """[R, S] distinct token ids per row (a permutation's first S)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(4096, generator=gen)[: probs.shape[1]] for _ in probs])


def torch_reference(
    probs: torch.Tensor, ids: torch.Tensor, draws: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """The definition, op by op: counts and tail, the entry the draw picks, its token (-1:
    the tail), the listed ids with a positive count."""
    counts, tails = quantize_with_tail(probs)
    choice = sample_from_counts(torch.cat([counts, tails.unsqueeze(-1)], -1), draws)
    tokens = [int(ids[r, c]) if c < ids.shape[1] else -1 for r, c in enumerate(choice.tolist())]
    excluded = torch.where(counts > 0, ids, -1)
    return counts, tails, torch.tensor(tokens), excluded


@needs_native
@pytest.mark.parametrize("seed", range(8))
def test_native_matches_torch(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    probs = listed_rows(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    draws = torch.randint(0, PROPOSAL_TOTAL, (probs.shape[0],), generator=gen)
    draws[0], draws[1] = 0, PROPOSAL_TOTAL - 1  # the ends of the range
    ids = listed_ids(probs, seed)
    expected = torch_reference(probs, ids, draws)
    for native_on in ("0", "1"):
        monkeypatch.setenv(native.DISABLE_ENV, native_on)
        got = quantize_and_draw(probs, ids, draws)
        names = ("counts", "tails", "tokens", "excluded")
        for name, a, b in zip(names, got, expected, strict=True):
            assert torch.equal(a, b), (native_on, name)
    counts, tails, tokens, _ = got
    assert (tokens < 0).any() and (tokens >= 0).any()  # the tail and listed entries drawn
    assert ((counts.sum(-1) + tails) == PROPOSAL_TOTAL).all()


@needs_native
def test_every_draw_lands_in_its_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each draw picks the entry whose cumulative range holds it; zero counts are never
    picked, and the tail takes the draws past the listed entries."""
    monkeypatch.setenv(native.DISABLE_ENV, "1")
    probs = torch.tensor([[0.5, 0.0, 0.25, 1e-9]]).expand(PROPOSAL_TOTAL, -1).contiguous()
    ids = torch.tensor([[7, 3, 5, 9]]).expand(PROPOSAL_TOTAL, -1).contiguous()
    draws = torch.arange(PROPOSAL_TOTAL)
    counts, tails, tokens, excluded = quantize_and_draw(probs, ids, draws)
    assert counts[0].tolist() == [PROPOSAL_TOTAL // 2, 0, PROPOSAL_TOTAL // 4, 0]
    assert int(tails[0]) == PROPOSAL_TOTAL // 4
    assert excluded[0].tolist() == [7, -1, 5, -1]
    assert torch.bincount(tokens + 1, minlength=10).tolist() == [
        PROPOSAL_TOTAL // 4,
        0,
        0,
        0,
        0,
        0,
        PROPOSAL_TOTAL // 4,
        0,
        PROPOSAL_TOTAL // 2,
        0,
    ]  # fmt: skip  (token + 1: the tail's -1 at 0, token 5 at 6, token 7 at 8)


def test_a_strided_view_reads_its_own_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows ld apart (a slice of wider lists) give what their copies give."""
    wide = listed_rows(2)
    wide_ids = listed_ids(wide, 2)
    view, ids = wide[:, :5], wide_ids[:, :5]
    draws = torch.arange(wide.shape[0]) * 997
    got = quantize_and_draw(view, ids, draws)
    expected = quantize_and_draw(view.contiguous(), ids.contiguous(), draws)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.mark.parametrize("native_on", ["1", "0"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_rows_are_refused(
    monkeypatch: pytest.MonkeyPatch, native_on: str, bad: float
) -> None:
    monkeypatch.setenv(native.DISABLE_ENV, native_on)
    probs = torch.tensor([[0.5, 0.25], [0.5, bad]])
    with pytest.raises(ValueError, match="could not be quantised"):
        quantize_and_draw(probs, torch.tensor([[1, 2], [3, 4]]), torch.tensor([0, 1]))


@pytest.mark.parametrize("native_on", ["1", "0"])
def test_bad_draws_and_shapes_are_refused(monkeypatch: pytest.MonkeyPatch, native_on: str) -> None:
    monkeypatch.setenv(native.DISABLE_ENV, native_on)
    probs = torch.tensor([[0.5, 0.25], [0.5, 0.5]])
    ids = torch.tensor([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="draws"):
        quantize_and_draw(probs, ids, torch.tensor([0, PROPOSAL_TOTAL]))
    with pytest.raises(ValueError, match="draws"):
        quantize_and_draw(probs, ids, torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match="draws"):
        quantize_and_draw(probs, ids, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="ids"):
        quantize_and_draw(probs, ids[:, :1], torch.tensor([0, 1]))
    with pytest.raises(ValueError):
        quantize_and_draw(
            torch.empty(2, 0), torch.empty(2, 0, dtype=torch.long), torch.tensor([0, 1])
        )
