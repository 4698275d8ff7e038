"""Keep freed host memory in the process while models run on the CPU.

glibc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh mmap and
unmaps it on free. A verify pass at a real vocabulary allocates its logits anew each time:
80 rows (16 sequences, k = 4) x 151,936 float32 entries is 48.6 MB, so every pass faults in
and zeroes ~12,000 fresh pages, then unmaps them. Measured on one core: the packed lm_head
of that pass takes 38 ms with fresh pages and 20 ms when the allocator reuses freed memory.
After the models are loaded (the load's transient copies still go back to the kernel), the
runner tells glibc to serve large blocks from its heap and to keep up to TRIM_KEEP_BYTES of
free heap at the top: freed logits are reused instead of being unmapped. This is what a
caching allocator does on a GPU; resident memory stays near the high-water mark of a pass.

`SPECCTL_KEEP_HOST_MEMORY=0` leaves glibc's defaults alone. Other C libraries: nothing done.
"""

import ctypes
import ctypes.util
import os
import platform

M_TRIM_THRESHOLD = -1  # mallopt parameters, glibc's <malloc.h>
M_MMAP_MAX = -4
TRIM_KEEP_BYTES = 1 << 30  # free heap beyond this at the top is still returned to the kernel

_applied: bool | None = None  # None: not tried yet in this process


def keep_freed_host_memory() -> bool:
    """Ask glibc to keep large freed blocks for reuse; True when the setting is in force.
    Idempotent: the first call in a process decides."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    if os.environ.get("SPECCTL_KEEP_HOST_MEMORY", "1") == "0":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    mallopt = getattr(ctypes.CDLL(libc_name), "mallopt", None)
    if mallopt is None:
        return False
    # mallopt returns 1 on success, 0 on error
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_KEEP_BYTES))
