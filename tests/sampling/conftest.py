"""`sampler`: the rejection-sampler implementations a test runs against: the torch reference
always, the Triton kernel too in the interpreted child process (see triton_child.py)."""

from collections.abc import Callable

import pytest
from triton_child import is_kernel_child

from daemon.runtime.sampling.rejection import rejection_sample


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sampler" not in metafunc.fixturenames:
        return
    samplers: list[Callable] = [rejection_sample]
    ids = ["reference"]
    if is_kernel_child():
        from daemon.runtime.sampling.rejection_triton import rejection_sample_triton

        samplers.append(rejection_sample_triton)
        ids.append("triton")
    metafunc.parametrize("sampler", samplers, ids=ids)
