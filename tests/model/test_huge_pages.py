"""Packed weights on transparent huge pages: the same panels, in memory advised for huge pages."""

import mmap
import platform

import pytest
import torch

from daemon.runtime.model import huge_pages, skinny

linux_only = pytest.mark.skipif(
    platform.system() != "Linux" or not hasattr(mmap, "MADV_HUGEPAGE"),
    reason="transparent huge pages are a Linux feature",
)


def _vm_flags(address: int) -> set[str]:
    """The VmFlags of the mapping of this process that holds `address` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(part, 16) for part in head.split("-"))
                inside = start <= address < end
            elif inside and head == "VmFlags:":
                return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


def _reference_pack(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [ceil(N / 16), K, 16], zero past N: the layout written out the plain way."""
    out_features, in_features = weight.shape
    num_panels = -(-out_features // 16)
    padded = torch.zeros(num_panels * 16, in_features)
    padded[:out_features] = weight
    return padded.view(num_panels, 16, in_features).transpose(1, 2).contiguous()


@linux_only
def test_a_large_tensor_lives_on_advised_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(huge_pages.DISABLE_ENV, raising=False)
    tensor = huge_pages.empty((3, 1000, 1000))  # 12 MB
    assert tensor.shape == (3, 1000, 1000) and tensor.dtype == torch.float32
    assert tensor.data_ptr() % huge_pages.HUGE_PAGE == 0
    assert "hg" in _vm_flags(tensor.data_ptr())  # MADV_HUGEPAGE took
    tensor.fill_(2.0)
    view = tensor[1]
    del tensor  # the view keeps the mapping
    assert float(view.sum()) == 2.0 * 1000 * 1000


@linux_only
def test_small_tensors_and_the_switch_give_plain_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    small = huge_pages.empty((100, 100))  # 40 KB: under one huge page
    assert "hg" not in _vm_flags(small.data_ptr())
    monkeypatch.setenv(huge_pages.DISABLE_ENV, "0")
    switched_off = huge_pages.empty((3, 1000, 1000))
    assert "hg" not in _vm_flags(switched_off.data_ptr())


@pytest.mark.parametrize("out_features", [16 * 45, 16 * 45 + 7])  # whole panels; a partial one
def test_packing_onto_huge_pages_writes_the_same_panels(out_features: int) -> None:
    weight = torch.randn(out_features, 1024, generator=torch.Generator().manual_seed(0))
    packed = skinny.pack(weight)  # 2.9-3.0 MB: on huge pages where the system allows
    assert torch.equal(packed, _reference_pack(weight))
    gate_up = torch.randn(2 * out_features, 1024, generator=torch.Generator().manual_seed(1))
    gated = skinny.pack_gated(gate_up)
    gate, up = _reference_pack(gate_up[:out_features]), _reference_pack(gate_up[out_features:])
    assert torch.equal(gated, torch.stack((gate, up), dim=1).reshape(-1, 1024, 16))
    strided = torch.randn(1024, 2 * out_features)[:, ::2].t()  # [N, K], not contiguous
    assert torch.equal(skinny.pack(strided), _reference_pack(strided))
