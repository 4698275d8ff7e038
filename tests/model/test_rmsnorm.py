"""RMSNorm by the native kernel (and with the residual add fused) equals transformers' formula,
and falls back to torch's ops where the kernel does not apply."""

import pytest
import torch

from daemon.runtime.model import native
from daemon.runtime.model.rmsnorm import RMSNorm

needs_native = pytest.mark.skipif(native.kernels() is None, reason="native kernels not built")


def _reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: float32 variance, rsqrt, then the weight."""
    x_float = x.float()
    variance = x_float.pow(2).mean(-1, keepdim=True)
    return weight * (x_float * torch.rsqrt(variance + eps)).to(x.dtype)


def _norm(dim: int, eps: float = 1e-6) -> RMSNorm:
    norm = RMSNorm(dim, eps, torch.float32)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim, generator=torch.Generator().manual_seed(dim)))
    return norm


@needs_native
@pytest.mark.parametrize("shape", [(1, 1, 256), (3, 5, 64), (2, 7, 13), (1, 4, 2, 64), (0, 8)])
def test_native_matches_the_reference(shape: tuple[int, ...]) -> None:
    norm = _norm(shape[-1])
    assert norm.is_native
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)) * 3
    torch.testing.assert_close(norm(x), _reference(x, norm.weight, norm.eps), rtol=1e-5, atol=1e-6)


@needs_native
@pytest.mark.parametrize("shape", [(1, 1, 256), (4, 3, 40), (2, 2, 7)])
def test_add_forward_returns_the_sum_and_its_norm(shape: tuple[int, ...]) -> None:
    norm = _norm(shape[-1], eps=1e-5)
    gen = torch.Generator().manual_seed(2)
    x, residual = torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)
    total, normed = norm.add_forward(x, residual)
    torch.testing.assert_close(total, x + residual, rtol=0, atol=0)
    torch.testing.assert_close(
        normed, _reference(x + residual, norm.weight, norm.eps), rtol=1e-5, atol=1e-6
    )


def test_torch_path_where_the_kernel_does_not_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switched off (SPECCTL_NATIVE=0), a strided input, a bfloat16 norm: torch's ops, the
    same results."""
    monkeypatch.setenv(native.DISABLE_ENV, "0")
    off = _norm(64)
    assert not off.is_native
    x = torch.randn(3, 128)[:, ::2]  # strided rows
    torch.testing.assert_close(off(x), _reference(x, off.weight, off.eps), rtol=1e-5, atol=1e-6)
    total, normed = off.add_forward(x, x)
    torch.testing.assert_close(total, 2 * x)
    torch.testing.assert_close(normed, _reference(2 * x, off.weight, off.eps))
    monkeypatch.delenv(native.DISABLE_ENV)
    on = _norm(64)
    torch.testing.assert_close(on(x), _reference(x, on.weight, on.eps), rtol=1e-5, atol=1e-6)
    half = RMSNorm(64, 1e-6, torch.bfloat16)
    assert not half.is_native
    y = torch.randn(2, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(half(y), _reference(y, half.weight, half.eps))
