"""`sampler`: the rejection-sampler implementations a test runs against: the torch reference
always; the Triton kernel too in the interpreted child process (see triton_child.py), and
compiled on the GPU where one is (inputs moved there, outputs brought back)."""

from collections.abc import Callable
from typing import Any

import pytest
import torch
from triton_child import is_kernel_child

from daemon.runtime.sampling.rejection import rejection_sample


def triton_on_cuda(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The compiled kernel on CUDA copies of the inputs; its outputs back on the CPU."""
    from daemon.runtime.sampling.rejection_triton import rejection_sample_triton

    def cuda(value: Any) -> Any:
        return value.cuda() if isinstance(value, torch.Tensor) else value

    out, num = rejection_sample_triton(
        *map(cuda, args), **{name: cuda(value) for name, value in kwargs.items()}
    )
    assert out.is_cuda and num.is_cuda
    return out.cpu(), num.cpu()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sampler" not in metafunc.fixturenames:
        return
    samplers: list[Callable] = [rejection_sample]
    ids = ["reference"]
    if is_kernel_child():
        from daemon.runtime.sampling.rejection_triton import rejection_sample_triton

        samplers.append(rejection_sample_triton)
        ids.append("triton")
    elif torch.cuda.is_available():
        samplers.append(triton_on_cuda)
        ids.append("triton-cuda")
    metafunc.parametrize("sampler", samplers, ids=ids)
