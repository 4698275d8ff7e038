"""Device helpers shared by the engine and the benches."""

import torch


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a CUDA call returns once its kernels are launched,
    so a timer read after it measures the launch, not the work); nothing to wait for on a
    CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
