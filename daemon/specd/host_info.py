"""CPU count and system memory from the OS (Linux /proc/meminfo, sysconf elsewhere)."""

import os
import socket
from pathlib import Path

from daemon.specd.inventory import HostInfo

_MEMINFO = Path("/proc/meminfo")


def read_meminfo(text: str) -> dict[str, int]:
    """Parse /proc/meminfo text into bytes per key (`MemTotal: 1024 kB` -> 1048576)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            continue
        scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
        values[key.strip()] = int(parts[0]) * scale
    return values


def system_memory_bytes() -> tuple[int, int]:
    """(total, available) system memory in bytes."""
    try:
        info = read_meminfo(_MEMINFO.read_text())
        return info["MemTotal"], info.get("MemAvailable", info.get("MemFree", 0))
    except (OSError, KeyError):
        page = os.sysconf("SC_PAGE_SIZE")
        return page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")


def collect_host_info() -> HostInfo:
    total, available = system_memory_bytes()
    num_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return HostInfo(
        hostname=socket.gethostname(),
        num_cpus=num_cpus or 1,
        memory_total_bytes=total,
        memory_available_bytes=available,
    )
