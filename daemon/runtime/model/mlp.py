"""SwiGLU MLP with the gate and up projections fused into one matmul."""

import torch
import torch.nn.functional as F
from torch import nn

from daemon.runtime.model import skinny
from daemon.runtime.model.linear import Linear, can_use_skinny


class GateUpLinear(Linear):
    """The gate and up projections as one weight [2 * intermediate, hidden] (gate rows, then
    up rows); `swiglu(x)` gives silu(x @ gate^T) * (x @ up^T). Where the skinny GEMM runs, the
    weight is packed for its gated form (skinny.py), which never writes the [.., 2 * I]
    product; elsewhere it is a plain Linear followed by the activation."""

    gated: torch.Tensor | None = None  # skinny.pack_gated panels [2 * ceil(I / 16), hidden, 16]

    def prepack(self) -> bool:
        weight = self.weight.detach()
        if self.gated is None and self.bias is None and can_use_skinny(weight):
            self.gated = skinny.pack_gated(weight)
            self.keeps_dense = False
            self.weight = nn.Parameter(weight.new_empty(0), requires_grad=False)
            return True
        if self.gated is not None:
            return False
        return super().prepack()

    def swiglu(self, x: torch.Tensor) -> torch.Tensor:
        """`x` [..., hidden] -> [..., intermediate]."""
        half = self.out_features // 2
        if self.gated is not None:
            return skinny.gated_linear(x, self.gated, half)
        gate, up = super().forward(x).split(half, dim=-1)
        return F.silu(gate) * up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated is not None:
            raise RuntimeError("a gated-packed projection only gives swiglu(x)")
        return super().forward(x)


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.intermediate_size = intermediate_size
        # weight [2 * intermediate, hidden]: gate rows, then up rows
        self.gate_up_proj = GateUpLinear(hidden_size, 2 * intermediate_size, bias=bias, dtype=dtype)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`x` [B, T, hidden] -> [B, T, hidden]."""
        # [B, T, intermediate]
        return self.down_proj(self.gate_up_proj.swiglu(x))
