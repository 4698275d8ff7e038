"""Host tensors from lists (host_tensors.py) hold what torch.tensor would."""

import gc

import pytest
import torch

from daemon.runtime.host_tensors import float32_tensor, int64_tensor


def test_int64_values_the_same_as_torch_tensor() -> None:
    values = [0, -1, (1 << 63) - 1, -(1 << 63), 12345]
    assert torch.equal(int64_tensor(values), torch.tensor(values, dtype=torch.int64))
    assert int64_tensor([]).shape == (0,) and int64_tensor([]).dtype == torch.int64
    with pytest.raises(OverflowError):
        int64_tensor([1 << 63])


def test_float32_rounds_as_torch_tensor_does() -> None:
    values = [0.7, 1.0 / 3.0, 1e-8, 100.0, 1e-45]
    assert torch.equal(float32_tensor(values), torch.tensor(values))
    assert float32_tensor([]).shape == (0,) and float32_tensor([]).dtype == torch.float32


def test_the_tensor_keeps_its_memory_alive() -> None:
    kept = int64_tensor(list(range(64)))
    gc.collect()
    churn = [int64_tensor([-7] * 64) for _ in range(200)]  # reuse freed memory, if any
    assert kept.tolist() == list(range(64)) and len(churn) == 200
