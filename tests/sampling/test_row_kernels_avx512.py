"""The row kernels' AVX-512 loops (the verifier's softmax, the drafter's log normalisers) give
the same bits as their AVX2 loops: the same exps lane by lane, the same sums in the same
order. A sampled token then does not depend on which CPU computed its probabilities."""

import math
from collections.abc import Iterator

import pytest
import torch

from daemon.runtime.model import native, skinny
from daemon.runtime.sampling import block_maxima
from daemon.runtime.sampling.logits import log_normalizers, process_logits

pytestmark = pytest.mark.skipif(
    not skinny.has_avx512(), reason="this CPU has no AVX-512F (or the kernels are not built)"
)


@pytest.fixture(autouse=True)
def _empty_registry() -> Iterator[None]:
    block_maxima.clear()
    yield
    block_maxima.clear()


def _logits(vocab: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=gen) * torch.tensor([0.01, 1, 3, 10, 30])[:, None]
    logits[1, 3] = -math.inf  # a token the row cannot draw
    return logits


@pytest.mark.parametrize("vocab", [7, 64, 100, 64 * 37 + 5, 151_936])
def test_log_normalizers_the_same_bits(monkeypatch: pytest.MonkeyPatch, vocab: int) -> None:
    monkeypatch.setenv(native.DISABLE_ENV, "1")
    logits, temps = _logits(vocab), torch.tensor([0.1, 0.5, 0.7, 1.0, 2.0])
    monkeypatch.setenv(skinny.WIDE_ENV, "0")
    avx2 = log_normalizers(logits, temps)
    monkeypatch.setenv(skinny.WIDE_ENV, "1")
    avx512 = log_normalizers(logits, temps)
    assert torch.equal(avx512, avx2)
    expected = torch.logsumexp(logits.double() / temps.double().unsqueeze(-1), dim=-1)
    torch.testing.assert_close(avx512, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("vocab", [7, 64, 100, 64 * 37 + 5, 151_936])
def test_the_softmax_the_same_bits(monkeypatch: pytest.MonkeyPatch, vocab: int) -> None:
    monkeypatch.setenv(native.DISABLE_ENV, "1")
    logits, temps = _logits(vocab), torch.tensor([0.1, 0.5, 0.7, 1.0, 2.0])
    off = torch.zeros(5, dtype=torch.long), torch.ones(5)  # no top-k or top-p: the C softmax
    probs = {}
    for value in ("0", "1"):
        monkeypatch.setenv(skinny.WIDE_ENV, value)
        probs[value] = process_logits(logits.clone(), temps, *off, inplace=True)
        # the C softmax ran (torch's leaves no block maxima of the probabilities)
        assert block_maxima.lookup_rows(probs[value]) is not None
        block_maxima.clear()
    assert torch.equal(probs["1"], probs["0"])
    expected = torch.softmax(logits.double() / temps.double().unsqueeze(-1), dim=-1)
    torch.testing.assert_close(probs["1"].double(), expected, rtol=1e-5, atol=1e-7)
