"""SwiGLU MLP with the gate and up projections fused into one matmul."""

import torch
import torch.nn.functional as F
from torch import nn

from daemon.runtime.model.linear import Linear


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.intermediate_size = intermediate_size
        # weight [2 * intermediate, hidden]: gate rows, then up rows
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=bias, dtype=dtype)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`x` [B, T, hidden] -> [B, T, hidden]."""
        # [B, T, 2 * intermediate]
        gate_up = self.gate_up_proj(x)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)
