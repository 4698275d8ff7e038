"""The native attention kernel (rotary, K/V written, causal grouped-query attention of a decode
or verify chunk) against a torch reference: its blocked path with AVX-512 for head dims 64 and
128, with 256-bit registers for other multiples of 8 (and for every head dim with
SPECCTL_AVX512=0), and the per-query path for the rest (6 here)."""

import math

import pytest
import torch

from daemon.runtime.model import native

pytestmark = pytest.mark.skipif(
    native.kernels() is None, reason="the native kernels are not built or do not run here"
)

MAX_LEN = 160


def _case(
    batch: int, chunk: int, heads: int, kv_heads: int, dim: int, seed: int
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    slots = batch + 1  # one slot nobody uses
    return {
        "qkv": torch.randn(batch, chunk, (heads + 2 * kv_heads) * dim, generator=gen),
        "cos": torch.randn(MAX_LEN, dim, generator=gen),
        "ssin": torch.randn(MAX_LEN, dim, generator=gen),
        "keys": torch.randn(slots, kv_heads, MAX_LEN, dim, generator=gen),
        "values": torch.randn(slots, kv_heads, MAX_LEN, dim, generator=gen),
    }


def _native(
    case: dict[str, torch.Tensor], rows: torch.Tensor, heads: int, kv_heads: int, window: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    module = native.kernels()
    assert module is not None
    qkv, keys, values = case["qkv"], case["keys"].clone(), case["values"].clone()
    batch, chunk = qkv.shape[:2]
    dim = keys.shape[-1]
    out = torch.full((batch, chunk, heads * dim), math.nan)
    module.attention(
        qkv.data_ptr(), rows.data_ptr(), case["cos"].data_ptr(), case["ssin"].data_ptr(),
        keys.data_ptr(), values.data_ptr(), out.data_ptr(), batch, chunk, heads, kv_heads,
        dim, MAX_LEN, window, dim**-0.5,
    )  # fmt: skip
    return out, keys, values


def _rotate(x: torch.Tensor, cos: torch.Tensor, ssin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([x[..., half:], x[..., :half]], dim=-1) * ssin


def _reference(
    case: dict[str, torch.Tensor], rows: torch.Tensor, heads: int, kv_heads: int, window: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    qkv = case["qkv"].double()
    keys, values = case["keys"].double().clone(), case["values"].double().clone()
    cos, ssin = case["cos"].double(), case["ssin"].double()
    batch, chunk = qkv.shape[:2]
    dim = keys.shape[-1]
    group = heads // kv_heads
    out = torch.zeros(batch, chunk, heads * dim, dtype=torch.float64)
    for b, (slot, start, length) in enumerate(rows.tolist()):
        for t in range(length):  # the chunk's K/V first: every query sees its own chunk
            p = start + t
            for h in range(kv_heads):
                k = qkv[b, t, (heads + h) * dim : (heads + h + 1) * dim]
                keys[slot, h, p] = _rotate(k, cos[p], ssin[p])
                values[slot, h, p] = qkv[b, t, (heads + kv_heads + h) * dim :][:dim]
        for t in range(length):
            p = start + t
            lo = max(0, p - window + 1) if window else 0
            for h in range(heads):
                q = _rotate(qkv[b, t, h * dim : (h + 1) * dim], cos[p], ssin[p])
                k, v = keys[slot, h // group, lo : p + 1], values[slot, h // group, lo : p + 1]
                weights = torch.softmax(k @ q * dim**-0.5, dim=0)
                out[b, t, h * dim : (h + 1) * dim] = weights @ v
    return out.float(), keys.float(), values.float()


@pytest.mark.parametrize("avx512", ["1", "0"])
@pytest.mark.parametrize("dim", [64, 128, 32, 48, 6])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (2, 2), (8, 1)])
@pytest.mark.parametrize("window", [0, 7, 70])
def test_attention_matches_the_reference(
    avx512: str, dim: int, heads: int, kv_heads: int, window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECCTL_AVX512", avx512)
    case = _case(batch=4, chunk=5, heads=heads, kv_heads=kv_heads, dim=dim, seed=dim + heads)
    # [slot, start, length]: contexts of 1-151 keys (every remainder of 8 and 4), a short
    # chunk (its pads get zeros), a decode-length chunk
    rows = torch.tensor([[0, 0, 5], [2, 37, 5], [1, 146, 3], [4, 90, 1]], dtype=torch.int64)
    got, got_keys, got_values = _native(case, rows, heads, kv_heads, window)
    want, want_keys, want_values = _reference(case, rows, heads, kv_heads, window)
    torch.testing.assert_close(got_keys, want_keys, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_values, want_values, rtol=0, atol=0)
    real = torch.zeros(4, 5, dtype=torch.bool)
    for b, (_, _, length) in enumerate(rows.tolist()):
        real[b, :length] = True
    torch.testing.assert_close(got[real], want[real], rtol=1e-4, atol=1e-5)
    assert (got[~real] == 0).all()  # the pads of the shorter chunks


def test_every_context_length_through_one_block_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    """Contexts of 1 to 40 keys one query at a time: every split into blocks of 8 and 4 and
    single keys, with scores whose maximum falls in the last ones."""
    monkeypatch.setenv("SPECCTL_AVX512", "1")
    for length in range(1, 41):
        case = _case(batch=1, chunk=1, heads=2, kv_heads=1, dim=64, seed=length)
        case["qkv"][0, 0, 2 * 64 : 3 * 64] *= 4.0  # the chunk's own key dominates
        rows = torch.tensor([[0, length - 1, 1]], dtype=torch.int64)
        got, _, _ = _native(case, rows, 2, 1, 0)
        want, _, _ = _reference(case, rows, 2, 1, 0)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("avx512", ["1", "0"])
def test_a_full_chunk_of_many_query_heads_on_one_kv_head(
    avx512: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 tokens x 16 query heads share one KV head: the blocked path's 256 queries at once."""
    monkeypatch.setenv("SPECCTL_AVX512", avx512)
    case = _case(batch=2, chunk=16, heads=16, kv_heads=1, dim=64, seed=4)
    rows = torch.tensor([[1, 100, 16], [0, 3, 16]], dtype=torch.int64)
    got, _, _ = _native(case, rows, 16, 1, 0)
    want, _, _ = _reference(case, rows, 16, 1, 0)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("row", "why"),
    [([0, 3, 6], "length 6"), ([0, 158, 5], "start 158"), ([0, -1, 2], "start -1")],
)
def test_a_row_outside_the_chunk_or_the_cache_is_a_clear_error(row: list[int], why: str) -> None:
    case = _case(batch=1, chunk=5, heads=4, kv_heads=2, dim=64, seed=1)
    rows = torch.tensor([row], dtype=torch.int64)
    with pytest.raises(ValueError, match=f"row 0 .*{why}.* chunk of 5 tokens .* 160 positions"):
        _native(case, rows, 4, 2, 0)
