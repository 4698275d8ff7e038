"""CPU count and system memory from the OS (Linux /proc/meminfo, lowered to what the process's
cgroup allows; sysconf elsewhere: daemon/cgroup_memory.py)."""

import os
import socket

from daemon.cgroup_memory import memory_bytes
from daemon.specd.inventory import HostInfo


def collect_host_info() -> HostInfo:
    total, available = memory_bytes()
    num_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return HostInfo(
        hostname=socket.gethostname(),
        num_cpus=num_cpus or 1,
        memory_total_bytes=total,
        memory_available_bytes=available,
    )
