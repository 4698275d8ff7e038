"""Small host tensors from Python lists, the fast way.

A round builds a few dozen small tensors from Python lists (rows, field keys, temperatures).
torch.tensor(list) infers a dtype by looking at every element and converts them one by one:
~8 us for 16 ints and ~20 us for 80 on this project's 2-core Xeon, more with the caches cold
after a forward pass. Packing the list into an `array.array` (C code that does one thing) and
wrapping its buffer takes 2-6 us. The tensor shares the array's memory and keeps it alive.
"""

import array
from collections.abc import Sequence

import torch


def int64_tensor(values: Sequence[int]) -> torch.Tensor:
    """[N] int64 on the host (values must fit in a signed 64-bit integer)."""
    if not values:
        return torch.empty(0, dtype=torch.int64)
    return torch.frombuffer(array.array("q", values), dtype=torch.int64)


def float32_tensor(values: Sequence[float]) -> torch.Tensor:
    """[N] float32 on the host: the values rounded to float32, as torch.tensor(values) does."""
    if not values:
        return torch.empty(0, dtype=torch.float32)
    return torch.frombuffer(array.array("f", values), dtype=torch.float32)


def host_int64(tensor: torch.Tensor) -> torch.Tensor:
    """An index tensor as contiguous int64 on the host (what the C kernels read): itself
    where it already is one."""
    if tensor.dtype == torch.int64 and tensor.is_contiguous() and tensor.device.type == "cpu":
        return tensor
    return tensor.to("cpu", torch.int64).contiguous()
