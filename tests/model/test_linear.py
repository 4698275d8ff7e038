"""Prepacked linear layers compute what F.linear computes, at every row count a round produces,
on either backend: the skinny GEMM's panels (float32, where it is built) and oneDNN's layout."""

import pytest
import torch
import torch.nn.functional as F

from daemon.runtime.model import skinny
from daemon.runtime.model.linear import (
    PACKED_MIN_ROWS,
    SKINNY_ENV,
    SMALL_WEIGHT_BYTES,
    Linear,
    can_prepack,
    prepack_linears,
)

pytestmark = pytest.mark.skipif(
    not can_prepack(torch.empty(2, 2)), reason="oneDNN is not available in this torch build"
)


@pytest.fixture(params=["skinny", "onednn"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which packing float32 weights get (SPECCTL_SKINNY selects it)."""
    if request.param == "skinny" and not skinny.available():
        pytest.skip("skinny GEMM not built")
    monkeypatch.setenv(SKINNY_ENV, "1" if request.param == "skinny" else "0")
    return str(request.param)


def _linear(in_f: int, out_f: int, bias: bool, dtype: torch.dtype) -> tuple[Linear, torch.Tensor]:
    gen = torch.Generator().manual_seed(in_f * 7 + out_f)
    layer = Linear(in_f, out_f, bias=bias, dtype=dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out_f, in_f, generator=gen) * in_f**-0.5)
        if layer.bias is not None:
            layer.bias.copy_(torch.randn(out_f, generator=gen))
    return layer, layer.weight.detach().clone()


@pytest.mark.parametrize("out_f,in_f", [(96, 64), (1024, 512)])  # small (dense kept) and large
@pytest.mark.parametrize("bias", [False, True])
def test_packed_matches_dense(out_f: int, in_f: int, bias: bool, backend: str) -> None:
    layer, weight = _linear(in_f, out_f, bias, torch.float32)
    b = None if layer.bias is None else layer.bias.detach().clone()
    assert layer.prepack()
    assert (layer.panels is not None) == (backend == "skinny")
    assert (layer.packed is not None) == (backend == "onednn")
    small = weight.numel() * 4 < SMALL_WEIGHT_BYTES
    assert layer.keeps_dense == (backend == "onednn" and small)
    gen = torch.Generator().manual_seed(1)
    for shape in [(1, 1), (1, 2), (1, 3), (1, 5), (1, 9), (4, 5), (3, 1), (2, 17)]:
        x = torch.randn(*shape, in_f, generator=gen)  # [B, T, in]
        with torch.inference_mode():
            got = layer(x)
        assert got.shape == (*shape, out_f)
        torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1e-4, atol=1e-4)


def test_non_contiguous_input(backend: str) -> None:
    layer, weight = _linear(512, 1024, False, torch.float32)
    layer.prepack()
    x = torch.randn(8, 5, 512).transpose(0, 1)  # [5, 8, 512], strided
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, weight), rtol=1e-4, atol=1e-4)


def test_bfloat16() -> None:
    """Prepacked where this CPU's oneDNN has a bfloat16 matmul (AVX-512), dense otherwise
    (an AVX2-only CPU): either way the layer computes F.linear."""
    layer, weight = _linear(512, 1024, False, torch.bfloat16)
    supported = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert layer.prepack() == supported
    assert (layer.packed is not None) == supported
    x = torch.randn(1, 5, 512, dtype=torch.bfloat16)
    with torch.inference_mode():
        got = layer(x).float()
    torch.testing.assert_close(got, F.linear(x.float(), weight.float()), rtol=2e-2, atol=3e-2)


def test_large_weight_dense_copy_is_freed_and_small_rows_padded(backend: str) -> None:
    layer, weight = _linear(512, 1024, False, torch.float32)  # 2 MiB
    layer.prepack()
    assert layer.weight.numel() == 0 and not layer.keeps_dense
    assert not layer.prepack()  # once
    x = torch.randn(PACKED_MIN_ROWS - 1, 512)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, weight), rtol=1e-4, atol=1e-4)


def test_env_switch_keeps_dense_weights(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    layer, _ = _linear(512, 1024, False, torch.float32)
    monkeypatch.setenv("SPECCTL_PREPACK", "0")
    assert prepack_linears(torch.nn.Sequential(layer)) == 0
    assert layer.packed is None and layer.panels is None
    assert layer.weight.numel() == 512 * 1024
    monkeypatch.setenv("SPECCTL_PREPACK", "1")
    assert prepack_linears(torch.nn.Sequential(layer)) == 1
