"""The skinny GEMM computes F.linear at every shape a pass produces, on one thread or several,
on its AVX2 path and (where the CPU has AVX-512F) its many-row AVX-512 path."""

import platform
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from daemon.runtime.model import skinny


def _cpu_has_avx2_fma() -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    if platform.machine().lower() not in ("x86_64", "amd64") or not cpuinfo.is_file():
        return False
    lines = cpuinfo.read_text().splitlines()
    flags = next((line for line in lines if line.startswith("flags")), "")
    return {"avx2", "fma"} <= set(flags.split())


def _cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return set()
    lines = cpuinfo.read_text().splitlines()
    return set(next((line for line in lines if line.startswith("flags")), "").split())


@pytest.fixture(autouse=True, params=["default", "avx2", "avx512"])
def row_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs three ways: the shipped threshold (AVX-512 from WIDE_MIN_ROWS rows, or
    WIDE_MIN_ROWS_SPLIT_512, where the CPU has it), the AVX2 path for every row count, the
    AVX-512 path for every row count (the same as AVX2 where the CPU lacks it)."""
    value = {"default": None, "avx2": "0", "avx512": "1"}[request.param]
    if value is None:
        monkeypatch.delenv(skinny.WIDE_ENV, raising=False)
    else:
        monkeypatch.setenv(skinny.WIDE_ENV, value)
    return request.param


def test_the_kernel_is_built_where_it_can_run() -> None:
    """On an x86-64 CPU with AVX2 and FMA the install must have built it: an optional build
    that failed silently would otherwise leave every pass on the slower oneDNN path."""
    if not _cpu_has_avx2_fma():
        pytest.skip("this CPU cannot run the kernel (not x86-64 with AVX2 and FMA)")
    assert skinny.available(), "the native kernels were not built: rerun scripts/setup.sh"


pytestmark_kernel = pytest.mark.skipif(not skinny.available(), reason="skinny GEMM not built")


def test_the_many_row_path_runs_where_the_cpu_has_avx512() -> None:
    if "avx512f" not in _cpu_flags() or not _cpu_has_avx2_fma():
        pytest.skip("this CPU has no AVX-512F: the AVX2 path takes every row count")
    assert skinny.has_avx512()


@pytest.mark.parametrize("value", ["-1", "many", "1.5"])
def test_a_bad_row_threshold_is_a_clear_error(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(skinny.WIDE_ENV, value)
    with pytest.raises(ValueError, match=r"SPECCTL_AVX512=.*expected 0 \(off\) or a row count"):
        skinny.wide_min_rows()


_CPUINFO = """processor	: 0
vendor_id	: {vendor}
cpu family	: {family}
model		: 17
flags		: fpu avx2 fma {avx512}

processor	: 1
vendor_id	: GenuineIntel
"""


@pytest.mark.parametrize(
    "vendor,family,avx512,splits",
    [
        ("AuthenticAMD", 25, "avx512f avx512vl", True),  # Zen 4
        ("AuthenticAMD", 26, "avx512f avx512vl", False),  # Zen 5: 512-bit units
        ("AuthenticAMD", 25, "", False),  # Zen 3: no AVX-512
        ("GenuineIntel", 6, "avx512f avx512vl", False),
    ],
)
def test_which_cpus_split_512_bit_operations(
    vendor: str, family: int, avx512: str, splits: bool
) -> None:
    """Zen 4 runs a 512-bit FMA on two 256-bit halves, so the AVX-512 path starts at 64 rows
    there (WIDE_MIN_ROWS_SPLIT_512) rather than 15; only the first processor's block counts."""
    text = _CPUINFO.format(vendor=vendor, family=family, avx512=avx512)
    assert skinny.splits_512bit_ops(text) is splits


@pytest.mark.parametrize(
    "vendor,family,avx512,prefers",
    [
        ("AuthenticAMD", 25, "avx512f avx512vl", False),  # Zen 4: 512-bit FMAs split in two
        ("AuthenticAMD", 26, "avx512f avx512vl", True),  # Zen 5
        ("AuthenticAMD", 27, "avx512f avx512vl", True),
        ("AuthenticAMD", 26, "", False),  # no AVX-512F
        ("GenuineIntel", 6, "avx512f avx512vl", False),  # not measured there
    ],
)
def test_which_cpus_take_512_bit_register_blocks(
    vendor: str, family: int, avx512: str, prefers: bool
) -> None:
    text = _CPUINFO.format(vendor=vendor, family=family, avx512=avx512)
    assert skinny.prefers_512bit_blocks(text) is prefers


def test_the_512_bit_blocks_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """SPECCTL_ZMM forces the 512-bit register blocks on or off, SPECCTL_AVX512=0 turns them
    off with the rest of AVX-512, a bad value is a clear error; unset, the CPU decides."""
    monkeypatch.delenv(skinny.WIDE_ENV, raising=False)
    monkeypatch.delenv(skinny.ZMM_ENV, raising=False)
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text() if cpuinfo.is_file() else ""
    assert skinny.zmm_blocks() is skinny.prefers_512bit_blocks(text)
    monkeypatch.setenv(skinny.ZMM_ENV, "1")
    assert skinny.zmm_blocks()
    monkeypatch.setenv(skinny.WIDE_ENV, "0")
    assert not skinny.zmm_blocks()
    monkeypatch.delenv(skinny.WIDE_ENV)
    monkeypatch.setenv(skinny.ZMM_ENV, "0")
    assert not skinny.zmm_blocks()
    monkeypatch.setenv(skinny.ZMM_ENV, "yes")
    with pytest.raises(ValueError, match=r"SPECCTL_ZMM='yes': expected 1 \(on\) or 0 \(off\)"):
        skinny.zmm_blocks()


def test_the_default_threshold_follows_this_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(skinny.WIDE_ENV, raising=False)
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text() if cpuinfo.is_file() else ""
    want = (
        skinny.WIDE_MIN_ROWS_SPLIT_512 if skinny.splits_512bit_ops(text) else skinny.WIDE_MIN_ROWS
    )
    assert skinny.wide_min_rows() == want


@pytestmark_kernel
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 5, 7, 8, 9, 10, 12, 13, 14, 15, 24, 40, 97, 200])
@pytest.mark.parametrize("path", ["1", None, "zmm", "ymm"])
def test_every_path_gives_the_same_bits(
    gated: bool, rows: int, path: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every path adds x_k w_k into each output in k order with one FMA a step, so they agree
    to the bit with blocks of at most 6 rows (SPECCTL_AVX512=0): the AVX-512 path for every
    row count ("1"), the shipped thresholds (None: one tall block of up to 14 rows where
    the CPU has AVX-512VL, the AVX-512 path from 15 or 64 rows), and those with the blocks
    below the AVX-512 path in 512-bit registers or not whatever the CPU ("zmm", "ymm":
    SPECCTL_ZMM=1 / 0). A row's greedy token cannot depend on how many rows share its pass."""
    hidden, out_f = 300, 16 * 5 + 3  # K past two K blocks of 128, an odd and partial panel
    weight = _weight(2 * out_f if gated else out_f, hidden, seed=rows)
    packed = skinny.pack_gated(weight) if gated else skinny.pack(weight)
    run = skinny.gated_linear if gated else skinny.linear
    x = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(rows))
    monkeypatch.setenv(skinny.WIDE_ENV, "0")
    six_row_blocks = run(x, packed, out_f)
    if path in (None, "zmm", "ymm"):
        monkeypatch.delenv(skinny.WIDE_ENV)
        if path is not None:
            monkeypatch.setenv(skinny.ZMM_ENV, "1" if path == "zmm" else "0")
    else:
        monkeypatch.setenv(skinny.WIDE_ENV, path)
    assert torch.equal(run(x, packed, out_f), six_row_blocks)


@pytestmark_kernel
@pytest.mark.parametrize("rows", [6, 7, 10, 14, 20])
@pytest.mark.parametrize("stride", [1024, 2048, 1040])
@pytest.mark.parametrize("in_f", [1000, 1008])  # 1008 + 16: 4 KB again, so one line more
def test_rows_4_kb_apart(rows: int, stride: int, in_f: int) -> None:
    """Rows a multiple of 4 KB apart (an MLP's down projection reads the [rows, 16384]
    activation) are copied further apart before a block of more than 6 of them runs (their
    lines would share L1 sets): the product and each row's bits do not change."""
    out_f = 40
    weight = _weight(out_f, in_f, seed=stride)
    packed = skinny.pack(weight)
    base = torch.randn(rows, stride, generator=torch.Generator().manual_seed(rows))
    x = base[:, :in_f]  # [rows, in_f] at a stride of `stride` floats
    got = skinny.linear(x, packed, out_f)
    torch.testing.assert_close(got, F.linear(x, weight), rtol=1e-4, atol=1e-4)
    alone = torch.cat([skinny.linear(x[i : i + 1], packed, out_f) for i in range(rows)])
    assert torch.equal(got, alone)


@pytestmark_kernel
@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7])
def test_rows_longer_than_l1(rows: int) -> None:
    """A block of 2-6 rows over panels that fill most of L2 (K = 16384: 1 MB a panel, 64 KB of
    x a row) takes the weights non-temporally (a prefetch: speed only, `bench.linear_bench`
    measures it); the product and each row's bits are those of any other block."""
    in_f, out_f = 16384, 80
    weight = _weight(out_f, in_f, seed=rows)
    packed = skinny.pack(weight)
    x = torch.randn(rows, in_f, generator=torch.Generator().manual_seed(rows))
    got = skinny.linear(x, packed, out_f)
    torch.testing.assert_close(got, F.linear(x, weight), rtol=1e-4, atol=1e-4)
    alone = torch.cat([skinny.linear(x[i : i + 1], packed, out_f) for i in range(rows)])
    assert torch.equal(got, alone)


@pytestmark_kernel
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("in_f", [512, 1000])
def test_blocks_of_six(gated: bool, in_f: int) -> None:
    """3 to 5 rows whose panels are longer than the prefetch distance (K = 512, 1000; 5 MB of
    weights, as a model's would stream) prefetch far in a block of six, whose extra rows repeat
    the last and are dropped: each row keeps its bits (alone, or among 1-7 rows) and the
    product is `F.linear`'s."""
    out_f = (5 << 20) // (4 * in_f) // (2 if gated else 1)
    weight = _weight(2 * out_f if gated else out_f, in_f, seed=in_f)
    packed = skinny.pack_gated(weight) if gated else skinny.pack(weight)
    run = skinny.gated_linear if gated else skinny.linear
    x = torch.randn(7, in_f, generator=torch.Generator().manual_seed(in_f))
    alone = torch.cat([run(x[i : i + 1], packed, out_f) for i in range(7)])
    for rows in range(1, 8):
        assert torch.equal(run(x[:rows], packed, out_f), alone[:rows]), f"{rows} rows"
    want = _swiglu_reference(x, weight) if gated else F.linear(x, weight)
    torch.testing.assert_close(alone, want, rtol=1e-4, atol=1e-4)


@pytestmark_kernel
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("in_f", [256, 1000, 16384])
def test_512_bit_blocks_over_streamed_weights(
    gated: bool, in_f: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 512-bit register blocks (SPECCTL_ZMM=1) with their prefetch (non-temporal for up to
    9 rows, far past them) over 5 MB of weights, as a model's would stream: at 1-14 rows each
    row has the bits of the 256-bit blocks of at most 6 rows (SPECCTL_AVX512=0), and the
    product is `F.linear`'s. Where the CPU has no AVX-512F the kernel runs the 256-bit blocks
    (the same bits)."""
    out_f = (5 << 20) // (4 * in_f) // (2 if gated else 1)
    weight = _weight(2 * out_f if gated else out_f, in_f, seed=in_f + gated)
    packed = skinny.pack_gated(weight) if gated else skinny.pack(weight)
    run = skinny.gated_linear if gated else skinny.linear
    x = torch.randn(14, in_f, generator=torch.Generator().manual_seed(in_f))
    monkeypatch.setenv(skinny.WIDE_ENV, "0")
    six_row_blocks = run(x, packed, out_f)
    monkeypatch.delenv(skinny.WIDE_ENV)
    monkeypatch.setenv(skinny.ZMM_ENV, "1")
    for rows in range(1, 15):
        assert torch.equal(run(x[:rows], packed, out_f), six_row_blocks[:rows]), f"{rows} rows"
    want = _swiglu_reference(x, weight) if gated else F.linear(x, weight)
    torch.testing.assert_close(six_row_blocks, want, rtol=1e-4, atol=1e-4)


def _weight(out_f: int, in_f: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(out_f, in_f, generator=gen) * in_f**-0.5


@pytestmark_kernel
@pytest.mark.parametrize("out_f,in_f", [(16, 8), (17, 5), (96, 64), (1000, 256), (256, 1000)])
@pytest.mark.parametrize(
    "rows",
    [0, 1, 2, 5, 6, 7, 12, 13, 17, 95, 96, 97, 200],  # around the 6-row and 96-row blocks
)
def test_matches_f_linear(out_f: int, in_f: int, rows: int) -> None:
    weight = _weight(out_f, in_f, seed=out_f + in_f)
    packed = skinny.pack(weight)
    assert packed.shape == (-(-out_f // 16), in_f, 16)
    x = torch.randn(rows, in_f, generator=torch.Generator().manual_seed(rows))
    got = skinny.linear(x, packed, out_f)
    assert got.shape == (rows, out_f)
    torch.testing.assert_close(got, F.linear(x, weight), rtol=1e-4, atol=1e-4)


@pytestmark_kernel
@pytest.mark.parametrize("gated", [False, True])
def test_a_row_comes_out_the_same_whatever_shares_its_call(gated: bool) -> None:
    """Rows are split into register blocks of near-equal size (7 rows: 4 + 3), and a block
    of several shares each K block of the weights with the others; a row's sums must not
    depend on either: the same bits alone as among 2..13 or 97 rows (greedy output may not
    change with the batch or the number of drafts verified)."""
    hidden, out_f = 1000, 80  # K past one K block (64), several panels
    weight = _weight(2 * out_f if gated else out_f, hidden, seed=3)
    packed = skinny.pack_gated(weight) if gated else skinny.pack(weight)
    run = skinny.gated_linear if gated else skinny.linear
    x = torch.randn(97, hidden, generator=torch.Generator().manual_seed(4))
    alone = torch.cat([run(x[i : i + 1], packed, out_f) for i in range(97)])
    for rows in [*range(2, 17), 97]:
        assert torch.equal(run(x[:rows], packed, out_f), alone[:rows]), f"{rows} rows"


@pytestmark_kernel
def test_batched_and_strided_inputs() -> None:
    weight = _weight(300, 128)
    packed = skinny.pack(weight)
    x = torch.randn(4, 5, 256)[..., ::2]  # [4, 5, 128], elements at a stride of 2
    torch.testing.assert_close(
        skinny.linear(x, packed, 300), F.linear(x, weight), rtol=1e-4, atol=1e-4
    )
    rows = torch.randn(9, 200)[:, :128]  # rows at a stride of 200, elements contiguous
    torch.testing.assert_close(
        skinny.linear(rows, packed, 300), F.linear(rows, weight), rtol=1e-4, atol=1e-4
    )


@pytestmark_kernel
def test_threads_split_the_panels() -> None:
    """A weight past MIN_THREAD_BYTES runs on torch's thread count, panels split between them
    (an odd number of panels, a partial last one): the same result as one thread."""
    weight = _weight(16 * 67 + 5, 1024)  # 4.4 MB
    assert weight.numel() * 4 >= skinny.MIN_THREAD_BYTES
    packed = skinny.pack(weight)
    x = torch.randn(9, 1024)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        got = skinny.linear(x, packed, weight.shape[0])
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got, F.linear(x, weight), rtol=1e-4, atol=1e-4)


def test_pack_rejects_what_it_cannot_hold() -> None:
    with pytest.raises(ValueError, match="float32"):
        skinny.pack(torch.zeros(4, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="2-D"):
        skinny.pack(torch.zeros(4))


def _swiglu_reference(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.silu(gate) * up


@pytestmark_kernel
@pytest.mark.parametrize("intermediate,hidden", [(16, 8), (23, 5), (704, 256), (40, 1000)])
@pytest.mark.parametrize("rows", [0, 1, 5, 7, 13, 97])
def test_gated_matches_silu_gate_times_up(intermediate: int, hidden: int, rows: int) -> None:
    gate_up = _weight(2 * intermediate, hidden, seed=intermediate)
    packed = skinny.pack_gated(gate_up)
    assert packed.shape == (2 * -(-intermediate // 16), hidden, 16)
    x = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(rows)) * 3
    got = skinny.gated_linear(x, packed, intermediate)
    assert got.shape == (rows, intermediate)
    torch.testing.assert_close(got, _swiglu_reference(x, gate_up), rtol=1e-4, atol=1e-5)


@pytestmark_kernel
def test_gated_activation_at_extreme_inputs() -> None:
    """silu's exp is clamped, never inf or NaN: a huge negative gate gives -0, a huge positive
    one the gate itself (an identity up projection makes the product visible)."""
    gate_up = torch.cat((torch.eye(16), torch.eye(16)))  # gate = up = x
    values = [-1e4, -100.0, -88.0, -20.0, -1.0, -1e-3, 0.0, 1e-3]
    x = torch.tensor([[*values, 1.0, 20.0, 88.0, 100.0, 1e4, 3.0, -3.0, 0.5]])
    got = skinny.gated_linear(x, skinny.pack_gated(gate_up), 16)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, F.silu(x) * x, rtol=1e-5, atol=1e-6)


@pytestmark_kernel
def test_gated_threads() -> None:
    gate_up = _weight(2 * 16 * 41 + 6, 1024)[: 2 * (16 * 41 + 3)]  # 2 x 659 rows, 5.4 MB
    packed = skinny.pack_gated(gate_up)
    x = torch.randn(6, 1024)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        got = skinny.gated_linear(x, packed, gate_up.shape[0] // 2)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got, _swiglu_reference(x, gate_up), rtol=1e-4, atol=1e-5)


def test_pack_gated_needs_two_halves() -> None:
    with pytest.raises(ValueError, match="even number of rows"):
        skinny.pack_gated(torch.zeros(5, 4))


def _padded_block_max(logits: torch.Tensor) -> torch.Tensor:
    """[R, V] -> [R, ceil(V / 64)] torch's amax of every 64 columns (the reference)."""
    rows, vocab = logits.shape
    blocks = -(-vocab // 64)
    padded = F.pad(logits, (0, blocks * 64 - vocab), value=-float("inf"))
    return padded.view(rows, blocks, 64).amax(dim=-1)


@pytestmark_kernel
@pytest.mark.parametrize("vocab", [16, 17, 64, 65, 1000, 64 * 37 + 5])
@pytest.mark.parametrize("rows", [0, 1, 7, 97])
def test_block_maxima_match_amax(vocab: int, rows: int) -> None:
    """The LM head's block maxima are amax over every 64 logits (the last block what is
    left), and its logits are F.linear's."""
    weight = _weight(vocab, 48, seed=vocab)
    x = torch.randn(rows, 48, generator=torch.Generator().manual_seed(rows))
    logits, maxima = skinny.logits_with_block_maxima(x, skinny.pack(weight), vocab)
    torch.testing.assert_close(logits, F.linear(x, weight), rtol=1e-4, atol=1e-4)
    assert maxima.shape == (rows, -(-vocab // 64))
    assert torch.equal(maxima, _padded_block_max(logits))


@pytestmark_kernel
@pytest.mark.parametrize("threads", [2, 3, 5])
def test_block_maxima_threads_own_whole_blocks(threads: int) -> None:
    """Past MIN_THREAD_BYTES the panels are split between threads in whole blocks of 4 (a
    block split between two threads would get two half maxima, one lost): 1,069 panels, the
    last block of 1 panel and partial."""
    vocab = 16 * 1068 + 5
    weight = _weight(vocab, 64)
    assert weight.numel() * 4 >= skinny.MIN_THREAD_BYTES
    x = torch.randn(5, 64)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        logits, maxima = skinny.logits_with_block_maxima(x, skinny.pack(weight), vocab)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(logits, F.linear(x, weight), rtol=1e-4, atol=1e-4)
    assert torch.equal(maxima, _padded_block_max(logits))


@pytestmark_kernel
def test_block_maxima_nan_and_infinities() -> None:
    """A block holding a NaN has a NaN maximum (amax's rule); a +inf logit is its block's
    maximum and a -inf one never is."""
    vocab = 64 * 5 + 3
    weight = _weight(vocab, 8)
    weight[70] = float("nan")  # block 1: a NaN logit in every row
    weight[200] = float("inf")  # block 3: +inf where the row's sum is positive, else -inf
    x = torch.ones(3, 8)
    x[2] = -1.0
    logits, maxima = skinny.logits_with_block_maxima(x, skinny.pack(weight), vocab)
    reference = _padded_block_max(logits)
    assert torch.isnan(maxima[:, 1]).all() and torch.isnan(reference[:, 1]).all()
    assert maxima[0, 3] == maxima[1, 3] == float("inf")
    assert torch.isfinite(maxima[2, 3])
    keep = [0, 2, 3, 4, 5]
    assert torch.equal(maxima[:, keep], reference[:, keep])
