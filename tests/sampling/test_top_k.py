"""top_k: the k largest entries of each row, in C where the native kernels run (two heaps over
the rows' block maxima) and in torch elsewhere; the same values as torch.topk, largest first,
with ids that hold them (any of tied ids), unique within a row."""

import math
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from daemon.runtime.model import native
from daemon.runtime.sampling import block_maxima
from daemon.runtime.sampling.logits import TOP_K_BLOCK, _native_top_k, top_k


@pytest.fixture(autouse=True)
def _empty_registry() -> Iterator[None]:
    block_maxima.clear()
    yield
    block_maxima.clear()


def _check(values: torch.Tensor, k: int, top: torch.Tensor, ids: torch.Tensor) -> None:
    expected = values.topk(k, dim=-1).values
    assert top.shape == ids.shape == (values.shape[0], k)
    assert torch.equal(top, expected)
    assert torch.equal(values.gather(-1, ids), top)  # the ids hold the values
    for row in ids.tolist():
        assert len(set(row)) == k


def _remember(values: torch.Tensor) -> None:
    blocks = -(-values.shape[-1] // TOP_K_BLOCK)
    padded = F.pad(values, (0, blocks * TOP_K_BLOCK - values.shape[-1]), value=-math.inf)
    block_maxima.remember(values, padded.view(values.shape[0], blocks, -1).amax(dim=-1))


@pytest.mark.parametrize("native_on", ["1", "0"])
@pytest.mark.parametrize("vocab", [151_936, 64 * 300 + 17, 4096, 64 * 21, 40])
@pytest.mark.parametrize("k", [1, 5, 32])
def test_the_k_largest_as_torch_finds_them(
    monkeypatch: pytest.MonkeyPatch, native_on: str, vocab: int, k: int
) -> None:
    monkeypatch.setenv(native.DISABLE_ENV, native_on)
    gen = torch.Generator().manual_seed(vocab + k)
    values = torch.randn(9, vocab, generator=gen) * 3  # [R, V]
    values[1] = torch.randint(-3, 3, (vocab,), generator=gen).float()  # ties everywhere
    values[2, -1] = 100.0  # the best in the partial last block
    values[3] = -math.inf  # no finite entry
    values[3, [0, vocab // 2]] = 1.0
    span = min(64 * k, vocab)
    values[4, :span] = 50.0 + torch.arange(span).float()  # the best k blocks adjacent
    _check(values, k, *top_k(values, k))
    _check(values[::2], k, *top_k(values[::2], k))  # rows ld apart
    found = _native_top_k(values, k)  # the kernel itself, also where top_k leaves k to torch
    assert (found is None) == (native_on == "0" or native.kernels() is None)
    if found is not None:
        _check(values, k, *found)
    _remember(values)  # from the LM head's maxima
    _check(values, k, *top_k(values, k))
    _check(values[1::3], k, *top_k(values[1::3], k))


def test_the_kernel_runs_and_leaves_rows_with_a_nan_to_torch() -> None:
    if native.for_rows(torch.zeros(1, 1)) is None:
        pytest.skip("the native kernels do not run here")
    gen = torch.Generator().manual_seed(3)
    values = torch.randn(4, 151_936, generator=gen)
    found = _native_top_k(values, 32)
    assert found is not None
    _check(values, 32, *found)
    values[2, 777] = math.nan
    assert _native_top_k(values, 32) is None
    top, ids = top_k(values, 32)  # torch's answer: NaN is the largest
    assert torch.equal(ids[2, :1], torch.tensor([777]))
    assert torch.equal(top[[0, 1, 3]], values[[0, 1, 3]].topk(32).values)
