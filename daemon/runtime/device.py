"""Device helpers shared by the engine and the benches."""

import os

import torch


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a CUDA call returns once its kernels are launched,
    so a timer read after it measures the launch, not the work); nothing to wait for on a
    CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


TRITON_ENV = "SPECCTL_TRITON"  # "0": the torch paths on a GPU instead of the Triton kernels


def triton_enabled() -> bool:
    """Whether the sampler may run its Triton kernels on a GPU (`SPECCTL_TRITON=0` turns them
    off, for comparing with the torch paths)."""
    return os.environ.get(TRITON_ENV, "1") != "0"
