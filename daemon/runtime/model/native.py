"""The CPU runner's compiled kernels (_cpu_kernels.c), when they were built and run here.

setup.py builds them as an optional extension: without a C compiler, on another architecture or
on a CPU without AVX2 and FMA, `kernels()` is None and the runner keeps torch's own ops. A build
older than this code (the C source changed, setup not rerun) is not used either: its functions
may take other arguments.
"""

import logging
import os
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

ABI_VERSION = 20  # what the wrappers call; the built module states its own
DISABLE_ENV = "SPECCTL_NATIVE"  # "0": torch's ops only (for before/after measurements)


def _load() -> ModuleType | None:
    try:
        from daemon.runtime.model import _cpu_kernels as module
    except ImportError:  # not built
        return None
    if getattr(module, "ABI_VERSION", None) != ABI_VERSION:
        logger.warning(
            "%s is a stale build (ABI %s, expected %d): torch's ops run instead; "
            "rerun scripts/setup.sh",
            module.__file__,
            getattr(module, "ABI_VERSION", None),
            ABI_VERSION,
        )
        return None
    return module if module.available() else None


_module = _load()


def kernels() -> ModuleType | None:
    """The built module where it runs on this CPU, else None."""
    return _module


def enabled() -> bool:
    """Whether new layers should use the kernels: built, runnable, and not switched off with
    SPECCTL_NATIVE=0 (layers decide when they are built or packed, so one process can hold
    models of both kinds for a side-by-side measurement)."""
    return _module is not None and os.environ.get(DISABLE_ENV, "1") != "0"


def for_rows(x: torch.Tensor) -> ModuleType | None:
    """The module, where it is enabled and `x` is what its row kernels read: 2-D float32 rows
    in CPU memory, each row's elements contiguous; else None."""
    if not enabled() or x.device.type != "cpu" or x.dtype != torch.float32:
        return None
    if x.dim() != 2 or x.stride(-1) != 1:
        return None
    return _module
