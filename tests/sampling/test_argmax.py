"""The CPU argmax (one C call, or torch's chunked passes where the kernels do not run) gives
torch.argmax's answer: first maximum, NaN as the maximum."""

import pytest
import torch

from daemon.runtime.model import native
from daemon.runtime.sampling.argmax import CHUNK, MIN_VOCAB, argmax_last


@pytest.fixture(params=["native", "torch"], autouse=True)
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test on both paths: the C kernel and torch's chunked passes."""
    if request.param == "native" and native.kernels() is None:
        pytest.skip("the native kernels are not built or do not run on this CPU")
    if request.param == "torch":
        monkeypatch.setenv(native.DISABLE_ENV, "0")
    return str(request.param)


@pytest.mark.parametrize("vocab", [MIN_VOCAB, 151_936, 32_000, 5 * CHUNK + 1, 100])
@pytest.mark.parametrize("rows", [1, 7, 80])
def test_matches_torch_on_random_rows(vocab: int, rows: int) -> None:
    gen = torch.Generator().manual_seed(vocab + rows)
    x = torch.randn(rows, vocab, generator=gen)  # [R, V]
    assert torch.equal(argmax_last(x), x.argmax(dim=-1))


def test_first_index_on_ties_across_chunks_and_tail() -> None:
    vocab = 10 * CHUNK + 17  # a ragged tail of 17
    x = torch.zeros(6, vocab)  # [6, V]
    x[0, [5, 3 * CHUNK, vocab - 1]] = 2.0  # tie in the first chunk, a later chunk, the tail
    x[1, [4 * CHUNK + 9, vocab - 3]] = 2.0  # tie between a chunk and the tail
    x[2, vocab - 2] = 3.0  # the tail strictly wins
    x[3, [CHUNK - 1, CHUNK]] = 1.0  # tie across a chunk boundary
    x[4] = -float("inf")  # every entry the same
    x[5, [2 * CHUNK + 1, 7 * CHUNK]] = float("nan")  # NaN is the maximum, the first one wins
    expected = torch.tensor([5, 4 * CHUNK + 9, vocab - 2, CHUNK - 1, 0, 2 * CHUNK + 1])
    assert torch.equal(x.argmax(dim=-1), expected)  # torch's rule, stated
    assert torch.equal(argmax_last(x), expected)


def test_nan_only_in_the_tail_wins() -> None:
    vocab = 8 * CHUNK + 5
    x = torch.randn(2, vocab, generator=torch.Generator().manual_seed(1))
    x[0, vocab - 1] = float("nan")
    assert torch.equal(argmax_last(x), x.argmax(dim=-1))


def test_leading_dimensions_and_non_contiguous_rows() -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 5, 6 * CHUNK + 3, generator=gen)  # [B, K+1, V]
    assert torch.equal(argmax_last(x), x.argmax(dim=-1))  # [B, K+1]
    picked = x[:, ::2]  # [B, 3, V] strided rows
    assert torch.equal(argmax_last(picked), picked.argmax(dim=-1))


def test_half_precision() -> None:
    x = torch.randn(3, 9 * CHUNK, generator=torch.Generator().manual_seed(3)).bfloat16()
    assert torch.equal(argmax_last(x), x.argmax(dim=-1))
