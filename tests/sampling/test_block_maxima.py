"""The LM head's block maxima: found for the logits they belong to (and views of their whole
rows), never for anything else or after the logits were overwritten, and every sampler that
takes them answers exactly as it does without them."""

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from daemon.runtime.model import native
from daemon.runtime.sampling import block_maxima
from daemon.runtime.sampling.argmax import argmax_last
from daemon.runtime.sampling.gumbel_field import field_keys, gumbel_argmax, gumbel_topk
from daemon.runtime.sampling.logits import process_logits, top_k

BLOCK = block_maxima.BLOCK


@pytest.fixture(autouse=True)
def _empty_registry() -> Iterator[None]:
    block_maxima.clear()
    yield
    block_maxima.clear()


def _maxima(logits: torch.Tensor) -> torch.Tensor:
    """[..., V] -> [..., ceil(V / 64)] amax of every block (what the LM head computes)."""
    vocab = logits.shape[-1]
    blocks = -(-vocab // BLOCK)
    padded = F.pad(logits, (0, blocks * BLOCK - vocab), value=-float("inf"))
    return padded.view(*logits.shape[:-1], blocks, BLOCK).amax(dim=-1)


def _recorded(logits: torch.Tensor) -> torch.Tensor:
    block_maxima.remember(logits, _maxima(logits))
    return logits


def test_views_of_whole_rows_find_their_rows_of_maxima() -> None:
    logits = _recorded(torch.randn(4, 5, 3 * BLOCK + 7))  # [B, K+1, V]
    for view in (
        logits,
        logits.view(20, -1),
        logits[1:3],
        logits[:, ::2],
        logits[2, 4],
        logits.transpose(0, 1),
    ):
        found = block_maxima.lookup(view)
        assert found is not None
        assert torch.equal(found, _maxima(view))


def test_anything_else_is_not_found() -> None:
    logits = _recorded(torch.randn(6, 4 * BLOCK))
    for other in (
        logits[:, 1:],  # not whole rows
        logits[:, :BLOCK],
        logits.view(-1),
        logits.clone(),  # other memory
        logits.view(12, 2 * BLOCK),  # rows of another width
        logits.double(),
    ):
        assert block_maxima.lookup(other) is None
    # a tensor that does not own its whole storage is not recorded
    part = torch.randn(8, 2 * BLOCK)[2:]
    block_maxima.remember(part, _maxima(part))
    assert block_maxima.lookup(part) is None


def test_only_the_newest_slots_are_kept() -> None:
    tensors = [_recorded(torch.randn(2, 2 * BLOCK)) for _ in range(block_maxima.SLOTS + 1)]
    assert block_maxima.lookup(tensors[0]) is None
    assert all(block_maxima.lookup(t) is not None for t in tensors[1:])


@pytest.mark.parametrize("vocab", [5 * BLOCK, 5 * BLOCK + 17])
def test_in_place_softmax_leaves_the_probabilities_maxima(
    monkeypatch: pytest.MonkeyPatch, vocab: int
) -> None:
    """process_logits overwrites its logits with probabilities: the logits' maxima must go
    with them (a greedy argmax or a top-k over the probabilities would otherwise use logit
    maxima). The C softmax leaves the probabilities' own block maxima instead, exactly; the
    torch softmax (native kernels off, or a truncating row) leaves none."""
    for native_on, k in ((True, 0), (False, 0), (True, 3)):
        monkeypatch.setenv(native.DISABLE_ENV, "1" if native_on else "0")
        logits = _recorded(torch.randn(3, vocab))
        probs = process_logits(
            logits,
            torch.full((3,), 0.7),
            torch.full((3,), k, dtype=torch.long),
            torch.ones(3),
            inplace=True,
        )
        assert k or probs.data_ptr() == logits.data_ptr()
        found = block_maxima.lookup(probs)
        if native_on and k == 0 and native.kernels() is not None:
            assert found is not None and torch.equal(found, _maxima(probs))
        else:
            assert found is None and block_maxima.lookup(logits) is None


def test_argmax_from_maxima_first_maximum_and_nan(monkeypatch: pytest.MonkeyPatch) -> None:
    vocab = 10 * BLOCK + 17  # a partial last block of 17
    x = torch.zeros(7, vocab)
    x[0, [5, 3 * BLOCK, vocab - 1]] = 2.0  # ties in the first block, a later one, the last
    x[1, [4 * BLOCK + 9, vocab - 3]] = 2.0
    x[2, vocab - 1] = 3.0  # the very last entry wins (the gathered block runs past V)
    x[3, [BLOCK - 1, BLOCK]] = 1.0  # a tie across a block boundary
    x[4] = -float("inf")
    x[5, [2 * BLOCK + 1, 7 * BLOCK]] = float("nan")  # NaN is the maximum, the first wins
    x[6, vocab - 2] = float("nan")
    expected = x.argmax(dim=-1)
    _recorded(x)
    assert block_maxima.lookup(x) is not None
    for use_native in ("1", "0"):  # the C kernel (where it runs), then torch's passes
        monkeypatch.setenv(native.DISABLE_ENV, use_native)
        assert torch.equal(argmax_last(x), expected)
        assert torch.equal(argmax_last(x.view(7, 1, vocab)[::2]), expected[::2].view(4, 1))


@pytest.mark.parametrize("vocab", [4 * BLOCK, 151_936, 2_000])
def test_argmax_top_k_and_gumbel_answer_as_without_maxima(vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(12, vocab, generator=gen) * 3  # [R, V]
    keys = field_keys(list(range(12)), [7] * 12)
    scale = torch.linspace(0.3, 1.5, 12)
    excluded = torch.randint(0, vocab, (12, 3), generator=gen)
    excluded[::2, 1:] = -1

    def answers() -> list[torch.Tensor]:
        rows = torch.tensor([1, 4, 9])
        return [
            argmax_last(logits),
            *top_k(logits, 5),
            gumbel_argmax(logits, keys),
            gumbel_argmax(logits, keys, noise_scale=scale),
            gumbel_argmax(logits, keys, excluded),  # masks in place while it searches
            gumbel_argmax(logits, keys[rows], rows=rows),
            gumbel_topk(logits, keys, 4, noise_scale=scale),
        ]

    without = answers()
    _recorded(logits)
    with_maxima = answers()
    assert block_maxima.lookup(logits) is not None  # still recorded: the masking restored
    for a, b in zip(without, with_maxima, strict=True):
        assert torch.equal(a, b)


def test_stale_maxima_would_change_the_answer() -> None:
    """The lookup is what the samplers use: maxima recorded for other values give another
    argmax (the reason in-place writers must forget them)."""
    logits = torch.zeros(1, 16 * BLOCK)  # [1, V] wide enough for the blocked argmax
    logits[0, 3 * BLOCK + 2] = 1.0
    wrong = torch.zeros(1, 16)
    wrong[0, 0] = 5.0  # says block 0 holds the maximum
    block_maxima.remember(logits, wrong)
    assert int(argmax_last(logits)) != 3 * BLOCK + 2
    block_maxima.forget(logits[0])
    assert int(argmax_last(logits)) == 3 * BLOCK + 2
