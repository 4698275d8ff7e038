"""Linear layers whose CPU matmul runs on prepacked weights: the skinny GEMM's panels for
float32 where it runs (skinny.py: x86-64 with AVX2), else oneDNN's blocked layout.

Why: at the row counts speculative decoding produces (a verify pass is k + 1 rows per
sequence), the CPU BLAS behind `F.linear` (MKL) runs one matrix-vector product per row for a
wide weight: verifying 5 tokens reads the weights 5 times, so a verify pass costs 2x a decode
step where it should cost about one. oneDNN's matmul on a weight reordered once into its blocked
layout (what vLLM's CPU path does too) reads the weights once for a few rows. Measured on a
2-core AMD EPYC (AVX-512), one thread, a [32768, 256] float32 weight (bench/linear_bench.py):
dense 4.1 ms at 1 row and 7.3 ms at 9 rows; packed 1.7 ms and 2.5 ms.

Two exceptions, both measured:
- oneDNN's kernel for fewer than 4 rows is slower than its 4-row one on a weight that does not
  fit the cache, so such a weight is multiplied with the rows zero-padded to 4.
- a small weight (under `SMALL_WEIGHT_BYTES`, in cache) costs ~12 us more per call packed than
  dense at 1 row: the draft's decode step is made of such calls. Small weights keep their dense
  copy (cheap) for 1-row calls.

A large weight's dense copy is freed once packed: the packed one replaces it.

The skinny GEMM (skinny.py) goes further: it streams a float32 weight at about the memory's
bandwidth for up to a block of rows (oneDNN reaches half of it on an AVX2 CPU), with ~2 us per
call, so it takes every float32 weight and every row count; oneDNN keeps bfloat16 weights and
CPUs the kernel does not run on. SPECCTL_SKINNY=0 selects oneDNN for before/after measurements
(SPECCTL_NATIVE=0: no native kernel at all).
"""

import os

import torch
import torch.nn.functional as F
from torch import nn

from daemon.runtime.model import native, skinny

PACKED_MIN_ROWS = 4  # a large weight is multiplied with at least this many rows (zero-padded)
SMALL_WEIGHT_BYTES = 1 << 20  # under this, 1-row calls use the dense copy
PACK_BATCH_HINT = 8  # rows oneDNN's weight layout is chosen for (4..32 measured alike)
PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
PREPACK_ENV = "SPECCTL_PREPACK"  # "0": keep dense weights (for before/after measurements)
SKINNY_ENV = "SPECCTL_SKINNY"  # "0": oneDNN instead of the skinny GEMM (the same)


def prepack_enabled() -> bool:
    return os.environ.get(PREPACK_ENV, "1") != "0"


def can_use_skinny(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and os.environ.get(SKINNY_ENV, "1") != "0"
        and native.enabled()
    )


def can_prepack(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype in PACKABLE_DTYPES
        and weight.dim() == 2
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and (weight.dtype != torch.bfloat16 or _bf16_supported())
    )


def _bf16_supported() -> bool:
    """oneDNN's bfloat16 matmul needs AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT: on an AVX2-only
    CPU its weight reorder raises, so such weights stay dense (F.linear)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check is not None and check())


class Linear(nn.Linear):
    """`nn.Linear` (same parameters and checkpoint names) that can `prepack()` its weight."""

    packed: torch.Tensor | None = None  # oneDNN's
    panels: torch.Tensor | None = None  # the skinny GEMM's [ceil(out / 16), in, 16]
    keeps_dense: bool = True

    def prepack(self) -> bool:
        """Pack the weight for the skinny GEMM, else reorder it for oneDNN; False (nothing
        changed) where neither can run, or once packed."""
        weight = self.weight.detach()
        if self.packed is not None or self.panels is not None:
            return False
        if can_use_skinny(weight):
            self.panels = skinny.pack(weight)
            self.keeps_dense = False
            self.weight = nn.Parameter(weight.new_empty(0), requires_grad=False)
            return True
        if not can_prepack(weight):
            return False
        # opaque oneDNN tensor holding the weight [out_features, in_features] in blocked layout
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_HINT)
        self.keeps_dense = weight.numel() * weight.element_size() < SMALL_WEIGHT_BYTES
        if not self.keeps_dense:
            self.weight = nn.Parameter(weight.new_empty(0), requires_grad=False)
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`x` [..., in_features] -> [..., out_features]."""
        if self.panels is not None:
            out = skinny.linear(x, self.panels, self.out_features)
            return out if self.bias is None else out.add_(self.bias)
        packed = self.packed
        if packed is None:
            return F.linear(x, self.weight, self.bias)
        rows = x.numel() // self.in_features
        if self.keeps_dense:
            if rows == 1:
                return F.linear(x, self.weight, self.bias)
            return torch.ops.mkldnn._linear_pointwise(
                x.contiguous(), packed, self.bias, "none", [], ""
            )
        if rows >= PACKED_MIN_ROWS:
            return torch.ops.mkldnn._linear_pointwise(
                x.contiguous(), packed, self.bias, "none", [], ""
            )
        # [PACKED_MIN_ROWS, in_features]: the rows, then zeros
        padded = x.new_zeros(PACKED_MIN_ROWS, self.in_features)
        padded[:rows] = x.reshape(rows, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(padded, packed, self.bias, "none", [], "")
        return out[:rows].reshape(*x.shape[:-1], self.out_features)


def prepack_linears(model: nn.Module) -> int:
    """Prepack every `Linear` of `model` (unless SPECCTL_PREPACK=0); returns how many."""
    if not prepack_enabled():
        return 0
    return sum(m.prepack() for m in model.modules() if isinstance(m, Linear))
