"""RMSNorm, computed in float32 and cast back, as transformers' Llama does; on a CPU with the
native kernels (native.py), one call per norm, with the residual add before it fused."""

import torch
import torch.nn.functional as F
from torch import nn

from daemon.runtime.model import native


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        # [dim]
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)
        self.is_native = native.enabled() and dtype == torch.float32  # native.py

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize `x` [..., dim] over its last dimension."""
        if self._is_native(x):
            return self._native(x, None)[1]
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # torch's own rms_norm: the same float32 arithmetic in one call from Python (on a
            # CPU still a few ops inside, ~16 us at one row of 256)
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # [..., dim] float32
        x_float = x.float()
        variance = x_float.pow(2).mean(-1, keepdim=True)
        return self.weight * (x_float * torch.rsqrt(variance + self.eps)).to(x.dtype)

    def add_forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, its norm), both [..., dim]: a decoder layer's residual step."""
        if self._is_native(x) and self._is_native(residual) and x.shape == residual.shape:
            total, normed = self._native(x, residual)
            assert total is not None
            return total, normed
        total = x + residual
        return total, self(total)

    def _is_native(self, x: torch.Tensor) -> bool:
        return (
            self.is_native
            and x.dtype == torch.float32
            and x.device.type == "cpu"
            and x.is_contiguous()
            and self.weight.device.type == "cpu"
        )

    def _native(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(x + residual or None, the norm) by the native kernel; contiguous float32 inputs."""
        module = native.kernels()
        assert module is not None
        normed = torch.empty_like(x)
        total = torch.empty_like(x) if residual is not None else None
        dim = x.shape[-1]
        module.rmsnorm(
            x.data_ptr(),
            0 if residual is None else residual.data_ptr(),
            self.weight.data_ptr(),
            normed.data_ptr(),
            0 if total is None else total.data_ptr(),
            x.numel() // dim if dim else 0,
            dim,
            self.eps,
        )
        return total, normed
