"""The skinny GEMM (_cpu_kernels.c): float32 y = x @ w^T on panel-packed weights, for the CPU.

A decode or verify pass multiplies a few rows by weights larger than the last-level cache: its
cost is reading them. `python -m bench.linear_bench` times the wide bench target's MLPs (6
layers of [32768, 256] and [256, 16384] float32, 302 MB, silu(gate) * up between) on a 2-core
AMD EPYC (Zen 3, AVX2), one thread, the backends interleaved: at 1 / 5 / 9 rows oneDNN
prepacked 44.7 / 69.8 / 80.5 ms, MKL `F.linear` 38.1 / 112 / 120 ms, this kernel 24.4 / 34.2 /
38.4 ms, where one read of the weights takes 25.7 ms; at 144 rows (a prefill) 466 ms against
oneDNN's 459. It streams each weight once per block of up to 96 rows, prefetching ahead.

Where the CPU has AVX-512VL, a register block holds up to 14 rows (the same 256-bit FMAs,
in 32 registers): a batch-1 verify of 6 to 13 drafts streams each panel once instead of twice.
On a 2-core AMD EPYC (Zen 4, AVX-512), same bench, one thread, one read of the weights 10.3-11.1
ms: 1 / 5 / 9 / 14 rows 10.8 / 13.0 / 14.7 / 24.2 ms (oneDNN 18.5 / 19.5 / 27.1 / 36.5; with
blocks of 6 rows and the AVX-512 path from 8 rows, stop 43's kernel: 12.9 / 14.3 / 20.4 /
26.8). Past ~8 rows a pass is bound by the FMAs there (two 256-bit FMAs a cycle at 3.65 GHz
against ~30 GB/s: 9 rows cost 9 cycles a 64-byte line, the memory brings one every ~7.6).

Past a few dozen rows (a prefill; a verify pass of many sequences) a pass is bound by the
multiply-adds, and there the AVX2 register block tops out near 20 flops a cycle. On a CPU
with AVX-512F a block of WIDE_MIN_ROWS rows or more takes the C source's AVX-512 path (x
packed once per block, 12 rows x 2 panels in 24 zmm registers): from 15 rows, or from 64 on a
CPU that runs 512-bit FMAs as two halves, like the Zen 4 above, where tall blocks are as fast
or faster up to there (ms, tall / AVX-512: 9 rows 14.0 / 19.8, 16 rows 27.9 / 30.1, 48 rows
76.6 / 82.8, 64 rows 104.3 / 105.8, 96 rows 166.0 / 152.3). Measured on a 2-core Intel
Xeon (Cascade Lake, AVX-512) with the same bench, one thread, ms per pass, AVX2 path /
AVX-512 path / oneDNN: 9 rows 32.2 / 31.6 / 40.3, 16 rows 47.4 / 39.5 / 53.2, 24 rows
69.7 / 47.9 / 68.0, 48 rows 134 / 86.3 / 113, 96 rows 278 / 169 / 197, 144 rows 414 / 255 /
282 (one read of the weights: 27 ms; below 8 rows the AVX2 path is as fast or faster). Both
paths add x_k w_k into each output in k order, one FMA a step: the same bits, so a row's
greedy token does not depend on how many rows share its pass.

On a CPU that runs AVX-512 at full width (AMD Zen 5), the register blocks below the AVX-512
path run in 512-bit registers (zmm_blocks(): one FMA a row and k step instead of two, the same
bits) with their own prefetch. Same bench on a 2-core Zen 5 EPYC, one thread, one read of the
weights 7.5-7.9 ms, 256-bit / 512-bit blocks interleaved: 1 / 4 / 8 / 9 / 10 rows 7.8 / 8.7 /
10.2 / 11.4 / 12.2 -> 7.2 / 7.3 / 7.7 / 8.1 / 8.4 ms (the C source has more shapes). The wide
bench target's forward pass at batch 1 then costs 1.00-1.13x one token's for 2-9 tokens
(256-bit blocks: up to 1.45x).

Packed layout: [P, K, 16] with P = ceil(N / 16), panel p holding output columns 16p..16p+15
(zero past N). Gated (a SwiGLU MLP's fused gate and up projections): the two weights' panels
alternate, [2P, K, 16], and the kernel writes silu(gate) * up, never the [rows, 2N] product.
Built here with torch, on transparent huge pages where the system allows (huge_pages.py: a
stream through 300 MB crosses 512 times fewer page boundaries); the C side only reads it.
"""

import functools
import os
from pathlib import Path

import torch

from daemon.runtime.model import huge_pages
from daemon.runtime.model.native import kernels

PANEL = 16  # output columns per panel (NR in the C source)
MIN_THREAD_BYTES = 4 << 20  # a weight under this runs on one thread: a thread costs ~20 us
WIDE_MIN_ROWS = 15  # a block of at least this many rows takes the AVX-512 path where it runs
# (below it, blocks of up to 14 rows where the CPU has AVX-512VL; see the docstring)
# ... where the CPU runs a 512-bit FMA as two 256-bit halves (AMD Zen 4): the AVX-512 path has
# no more multiply-adds a cycle to give there (the docstring has the figures)
WIDE_MIN_ROWS_SPLIT_512 = 64
WIDE_ENV = "SPECCTL_AVX512"  # "0": the AVX2 path for every row count (before/after figures)
ZMM_ENV = "SPECCTL_ZMM"  # "1" / "0": the 512-bit register blocks on / off (default: by CPU)


def first_cpu_fields(cpuinfo: str) -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo's text (it describes them all)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def _amd_avx512_family(cpuinfo: str) -> int:
    """The AMD CPU family of a CPU with AVX-512F, else 0."""
    fields = first_cpu_fields(cpuinfo)
    if (
        fields.get("vendor_id") != "AuthenticAMD"
        or "avx512f" not in fields.get("flags", "").split()
    ):
        return 0
    try:
        return int(fields.get("cpu family", ""))
    except ValueError:
        return 0


def splits_512bit_ops(cpuinfo: str) -> bool:
    """Whether /proc/cpuinfo's text describes a CPU with AVX-512 on 256-bit units: AMD
    family 25 (0x19, Zen 4; Zen 5 is 26, with 512-bit units)."""
    return _amd_avx512_family(cpuinfo) == 25


def prefers_512bit_blocks(cpuinfo: str) -> bool:
    """Whether /proc/cpuinfo's text describes a CPU where the small register blocks measured
    faster in 512-bit registers: AMD Zen 5 or later (family 26 and up, AVX-512 at full
    width). Not measured on Intel's AVX-512 CPUs: they keep the 256-bit blocks."""
    return _amd_avx512_family(cpuinfo) >= 26


def cpuinfo_text() -> str:
    """/proc/cpuinfo's text ("" where it cannot be read)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


@functools.cache
def default_wide_min_rows() -> int:
    """WIDE_MIN_ROWS, or WIDE_MIN_ROWS_SPLIT_512 where the CPU splits 512-bit operations."""
    return WIDE_MIN_ROWS_SPLIT_512 if splits_512bit_ops(cpuinfo_text()) else WIDE_MIN_ROWS


@functools.cache
def default_zmm_blocks() -> bool:
    """Whether this CPU runs the small register blocks in 512-bit registers by default."""
    return prefers_512bit_blocks(cpuinfo_text())


def zmm_blocks() -> bool:
    """Whether register blocks below the AVX-512 path's rows run in 512-bit registers (one
    FMA a row and k step where 256-bit ones take two; the C source's ZMICROS, with their own
    prefetch): default_zmm_blocks(), unless SPECCTL_ZMM is "1" or "0", or SPECCTL_AVX512 is
    "0" (no AVX-512 at all). The kernel runs them only where the CPU has AVX-512F."""
    if os.environ.get(WIDE_ENV, "").strip() == "0":
        return False
    value = os.environ.get(ZMM_ENV, "").strip()
    if not value:
        return default_zmm_blocks()
    if value not in ("0", "1"):
        raise ValueError(f"{ZMM_ENV}={value!r}: expected 1 (on) or 0 (off)")
    return value == "1"


def wide_min_rows() -> int:
    """The fewest rows of a block that the AVX-512 path takes (0: never):
    default_wide_min_rows(), unless SPECCTL_AVX512 is "0" (never) or a number (that many rows;
    tests force 1)."""
    value = os.environ.get(WIDE_ENV, "").strip()
    if not value:
        return default_wide_min_rows()
    try:
        rows = int(value)
    except ValueError:
        raise ValueError(f"{WIDE_ENV}={value!r}: expected 0 (off) or a row count") from None
    if rows < 0:
        raise ValueError(f"{WIDE_ENV}={value!r}: expected 0 (off) or a row count")
    return rows


def has_avx512() -> bool:
    """Whether the many-row path can run here (the kernels built, the CPU has AVX-512F)."""
    module = kernels()
    return module is not None and bool(module.has_avx512())


def available() -> bool:
    """Whether the kernel was built and this CPU runs it (x86-64 with AVX2 and FMA)."""
    return kernels() is not None


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [N, K] float32 -> panels [ceil(N / 16), K, 16] (contiguous, zero-padded)."""
    if weight.dtype != torch.float32 or weight.dim() != 2:
        raise ValueError(
            f"skinny pack takes a 2-D float32 weight, got {weight.dtype} {tuple(weight.shape)}"
        )
    out_features, in_features = weight.shape
    num_panels = -(-out_features // PANEL)
    packed = huge_pages.empty((num_panels, in_features, PANEL))  # streamed every pass
    _pack_into(packed, weight)
    return packed


def _pack_into(packed: torch.Tensor, weight: torch.Tensor) -> None:
    """`weight` [N, K] into panels `packed` [P, K, 16] (P = ceil(N / 16); zero past N)."""
    out_features, in_features = weight.shape
    full = out_features // PANEL
    # [P, 16, K] -> [P, K, 16] for the whole panels, then the last one padded with zeros
    packed[:full].copy_(weight[: full * PANEL].reshape(full, PANEL, in_features).transpose(1, 2))
    if full < packed.shape[0]:
        last = weight.new_zeros(PANEL, in_features)
        last[: out_features - full * PANEL] = weight[full * PANEL :]
        packed[full].copy_(last.t())


def pack_gated(gate_up: torch.Tensor) -> torch.Tensor:
    """`gate_up` [2N, K] float32 (gate rows, then up rows) -> alternating panels
    [2 * ceil(N / 16), K, 16]: gate panel p, then up panel p."""
    if gate_up.dim() != 2 or gate_up.shape[0] % 2:
        raise ValueError(f"a gated weight has an even number of rows, got {tuple(gate_up.shape)}")
    half = gate_up.shape[0] // 2
    if gate_up.dtype != torch.float32:
        raise ValueError(f"skinny pack takes a float32 weight, got {gate_up.dtype}")
    num_panels, in_features = -(-half // PANEL), gate_up.shape[1]
    packed = huge_pages.empty((2 * num_panels, in_features, PANEL))
    pairs = packed.view(num_panels, 2, in_features, PANEL)  # [P, 2, K, 16]
    _pack_into(pairs[:, 0], gate_up[:half])
    _pack_into(pairs[:, 1], gate_up[half:])
    return packed


def linear(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """`x` [..., K] float32 times the packed weight -> [..., out_features]."""
    return _run(x, packed, out_features, gated=False)


def gated_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """silu(x @ gate^T) * (x @ up^T) over `pack_gated` panels: `x` [..., K] float32 ->
    [..., out_features]."""
    return _run(x, packed, out_features, gated=True)


def logits_with_block_maxima(
    x: torch.Tensor, packed: torch.Tensor, out_features: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """An LM head: `x` [..., K] -> logits [..., V] and, computed while each block of 64
    columns is still in cache, their block maxima [..., ceil(V / 64)] (the pass over the
    logits that a sampler's argmax or Gumbel race would otherwise make; sampling/
    block_maxima.py)."""
    num_blocks = -(-out_features // BMAX_BLOCK)
    maxima = torch.empty(*x.shape[:-1], num_blocks, dtype=torch.float32)
    return _run(x, packed, out_features, gated=False, maxima=maxima), maxima


BMAX_BLOCK = 4 * PANEL  # columns per block maximum (BMAX_PANELS panels in the C source)


def runs_threaded(packed: torch.Tensor) -> bool:
    """Whether a GEMM over these panels runs on every thread (MIN_THREAD_BYTES or more)."""
    return packed.numel() * packed.element_size() >= MIN_THREAD_BYTES


def _run(
    x: torch.Tensor,
    packed: torch.Tensor,
    out_features: int,
    gated: bool,
    maxima: torch.Tensor | None = None,  # [rows, ceil(out_features / 64)] written, or None
) -> torch.Tensor:
    module = kernels()
    assert module is not None, "the skinny GEMM is not built or does not run on this CPU"
    in_features = packed.shape[1]
    out = torch.empty(*x.shape[:-1], out_features, dtype=torch.float32)
    if x.is_contiguous():  # the usual case: no reshape ops from Python
        flat, rows, stride = x, out.numel() // max(out_features, 1), in_features
    else:  # [rows, K]: the kernel reads rows at a stride, elements contiguous
        flat = x.reshape(-1, in_features)
        if flat.stride(1) != 1:
            flat = flat.contiguous()
        rows, stride = flat.shape[0], flat.stride(0)
    if rows:
        threads = torch.get_num_threads() if runs_threaded(packed) else 1
        module.gemm(
            flat.data_ptr(),
            stride,
            packed.data_ptr(),
            out.data_ptr(),
            out_features,
            rows,
            out_features,
            in_features,
            threads,
            gated,
            0 if maxima is None else maxima.data_ptr(),
            wide_min_rows(),
            zmm_blocks(),
        )
    return out
