"""Packed CPU weights on transparent huge pages.

A decode or verify pass on the CPU streams every packed weight from memory once (skinny.py).
On 4 KiB pages that stream leaves a page, and takes a TLB miss and a page walk, every 64 cache
lines; on 2 MiB pages 512 times less often. Measured on a 2-core AMD EPYC (Zen 3), one thread,
both kinds of page in one process and their passes interleaved, three runs each: the wide
bench target's MLPs alone (6 layers, 302 MB) took 0.86-1.03x the time on huge pages, 0.94 on
average; the whole target (t = 1..9 tokens at batch 1) 0.92-1.07x, about 0.97.

Most Linux systems hand out huge pages only to memory advised with MADV_HUGEPAGE
(/sys/kernel/mm/transparent_hugepage/enabled = madvise), and advising must come before the
pages are first written. So `empty` maps fresh anonymous memory, advises it, and returns a
tensor over it, 2 MiB aligned; the tensor owns the mapping (it is unmapped when the tensor is
freed). Where this does not apply (another system, a small tensor, the mapping refused, or
SPECCTL_HUGE_PAGES=0 for a before/after measurement) it is torch.empty, and nothing else
changes: the kernel would give 4 KiB pages in the end anyway.
"""

import contextlib
import mmap
import os
import platform

import torch

HUGE_PAGE = 2 << 20  # bytes (x86-64's and most arm64 kernels' transparent huge page)
DISABLE_ENV = "SPECCTL_HUGE_PAGES"  # "0": plain torch.empty


def enabled() -> bool:
    return (
        platform.system() == "Linux"
        and hasattr(mmap, "MADV_HUGEPAGE")
        and os.environ.get(DISABLE_ENV, "1") != "0"
    )


def empty(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised CPU tensor; from huge pages where it spans at least one and the system
    allows it (see the module's docstring), else torch.empty."""
    numel = 1
    for size in shape:
        numel *= size
    nbytes = numel * dtype.itemsize
    if nbytes < HUGE_PAGE or not enabled():
        return torch.empty(shape, dtype=dtype)
    try:
        # one page more than needed, so that the tensor can start on a 2 MiB boundary
        mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:
        return torch.empty(shape, dtype=dtype)
    # a kernel without transparent huge pages refuses: still fresh memory, still fine
    with contextlib.suppress(OSError):
        mapping.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(mapping, dtype=torch.uint8)  # holds the mapping while it lives
    start = -raw.data_ptr() % HUGE_PAGE
    return raw[start : start + nbytes].view(dtype).view(shape)
