"""RMSNorm, computed in float32 and cast back, as transformers' Llama does."""

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        # [dim]
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize `x` [..., dim] over its last dimension."""
        # [..., dim] float32
        x_float = x.float()
        variance = x_float.pow(2).mean(-1, keepdim=True)
        return self.weight * (x_float * torch.rsqrt(variance + self.eps)).to(x.dtype)
