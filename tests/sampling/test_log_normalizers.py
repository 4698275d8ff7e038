"""log_normalizers: the log of a softmax's denominator at each row's temperature, in C where
the native kernels run and in torch elsewhere, equal to torch.logsumexp in float64."""

import math
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from daemon.runtime.model import native
from daemon.runtime.sampling import block_maxima
from daemon.runtime.sampling.logits import log_normalizers


@pytest.fixture(autouse=True)
def _empty_registry() -> Iterator[None]:
    block_maxima.clear()
    yield
    block_maxima.clear()


def _reference(logits: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(logits.double() / temps.double().unsqueeze(-1), dim=-1)


@pytest.mark.parametrize("native_on", ["1", "0"])
@pytest.mark.parametrize("vocab", [1, 7, 64, 100, 64 * 37 + 5, 151_936])
def test_matches_logsumexp(monkeypatch: pytest.MonkeyPatch, native_on: str, vocab: int) -> None:
    monkeypatch.setenv(native.DISABLE_ENV, native_on)
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(6, vocab, generator=gen) * torch.tensor([0.01, 1, 3, 10, 30, 1])[:, None]
    temps = torch.tensor([0.1, 0.5, 0.7, 1.0, 2.0, 1.3])
    expected = _reference(logits, temps)
    torch.testing.assert_close(log_normalizers(logits, temps), expected, rtol=1e-6, atol=1e-6)
    # with the LM head's block maxima, and over strided rows of a larger tensor
    blocks = -(-vocab // 64)
    padded = F.pad(logits, (0, blocks * 64 - vocab), value=-math.inf)
    block_maxima.remember(logits, padded.view(6, blocks, 64).amax(dim=-1))
    torch.testing.assert_close(log_normalizers(logits, temps), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        log_normalizers(logits[::2], temps[::2]), expected[::2], rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("native_on", ["1", "0"])
def test_infinities_and_nan(monkeypatch: pytest.MonkeyPatch, native_on: str) -> None:
    monkeypatch.setenv(native.DISABLE_ENV, native_on)
    logits = torch.zeros(4, 64 * 3 + 1)
    logits[0] = -math.inf  # no distribution: -inf
    logits[1] = -math.inf
    logits[1, 100] = 2.0  # one finite logit: its own value / T
    logits[2, 5] = math.nan
    logits[3, 7] = math.inf
    out = log_normalizers(logits, torch.tensor([1.0, 0.5, 1.0, 1.0]))
    assert out[0] == -math.inf
    assert out[1] == pytest.approx(4.0)
    assert math.isnan(out[2])
    assert out[3] == math.inf
