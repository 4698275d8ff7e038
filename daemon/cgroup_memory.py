"""The memory this process may use: the machine's, or less where its cgroup limits it.

Inside a container (Docker `--memory`, a Kubernetes pod's limit, a systemd slice) /proc/meminfo
still shows the whole machine: a node that reported it would be planned shards it cannot hold,
and a shard that allocated its KV cache by it would be killed by the kernel's OOM killer
part-way through, with no message. The limit is the cgroup's (v2: memory.max; v1:
memory.limit_in_bytes), the tightest of the process's cgroup and its ancestors up to the
mount; what is in use counts the cgroup's charge less the file pages it may drop
(inactive_file), as the kubelet counts a working set. No torch here: specd reads it too.
"""

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

_PROC_CGROUP = Path("/proc/self/cgroup")
_MOUNTINFO = Path("/proc/self/mountinfo")
_MEMINFO = Path("/proc/meminfo")
NO_LIMIT = 1 << 60  # v1 says "no limit" as 2^63 less a page; v2 as "max"


@dataclass(frozen=True, slots=True)
class CgroupMemory:
    limit_bytes: int  # the tightest limit on the way up to the mount
    used_bytes: int  # charged to the cgroup, less its inactive file pages
    path: Path  # the process's cgroup directory


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


def memory_bytes() -> tuple[int, int]:
    """(total, available) memory in bytes for this process: the machine's (MemTotal,
    MemAvailable), each lowered to what its cgroup allows."""
    try:
        info = read_meminfo(_MEMINFO.read_text())
        total, available = info["MemTotal"], info.get("MemAvailable", info.get("MemFree", 0))
    except (OSError, KeyError):
        page = os.sysconf("SC_PAGE_SIZE")
        total, available = page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    limited = cgroup_memory()
    if limited is None:
        return total, available
    room = max(0, limited.limit_bytes - limited.used_bytes)
    return min(total, limited.limit_bytes), min(available, room)


def cgroup_memory(
    proc_cgroup: Path = _PROC_CGROUP, mountinfo: Path = _MOUNTINFO
) -> CgroupMemory | None:
    """The process's cgroup memory limit and use, or None where no limit applies (or the
    files cannot be read: not Linux, no cgroup mounted)."""
    located = memory_cgroup(proc_cgroup, mountinfo)
    return None if located is None else _read(*located)


def memory_cgroup(
    proc_cgroup: Path = _PROC_CGROUP, mountinfo: Path = _MOUNTINFO
) -> tuple[Path, Path, int] | None:
    """(the process's memory cgroup directory, the mount point of its hierarchy, the cgroup
    version), or None where none is mounted."""
    try:
        memberships = proc_cgroup.read_text().splitlines()
        mounts = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for version in (1, 2):  # a v1 memory controller, where mounted, is the one in force
        located = _locate(memberships, mounts, version)
        if located is not None:
            return (*located, version)
    return None


def _locate(memberships: list[str], mounts: list[str], version: int) -> tuple[Path, Path] | None:
    """(the process's cgroup directory, its mount point) for the memory controller."""
    path = None
    for line in memberships:
        number, _, rest = line.partition(":")
        controllers, _, where = rest.partition(":")
        v1_memory = version == 1 and "memory" in controllers.split(",")
        if v1_memory or (version == 2 and number == "0" and controllers == ""):
            path = where
    if path is None:
        return None
    for line in mounts:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        fstype, options = after[0], after[2].split(",") if len(after) > 2 else []
        if (version == 1 and fstype == "cgroup" and "memory" in options) or (
            version == 2 and fstype == "cgroup2"
        ):
            root, mount_point = fields[3], Path(fields[4])
            # a cgroup namespace (or a container's own mount) shows its root at the mount
            inside = os.path.relpath(path, root) if path.startswith(root) else "."
            directory = (mount_point / inside).resolve()
            if not directory.is_dir() or not directory.is_relative_to(mount_point):
                directory = mount_point
            return directory, mount_point
    return None


def _read(directory: Path, mount_point: Path, version: int) -> CgroupMemory | None:
    limit_file, usage_file, inactive_key = (
        ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        if version == 1
        else ("memory.max", "memory.current", "inactive_file")
    )
    limit = NO_LIMIT
    at = directory
    while True:
        limit = min(limit, _number(at / limit_file))
        if at == mount_point or at.parent == at:
            break
        at = at.parent
    if limit >= NO_LIMIT:
        return None
    usage = _number(directory / usage_file, default=0)
    inactive = 0
    with contextlib.suppress(OSError, ValueError):
        for line in (directory / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_key:
                inactive = int(value)
    return CgroupMemory(limit, max(0, usage - inactive), directory)


def _number(path: Path, default: int = NO_LIMIT) -> int:
    """A cgroup file's number ("max": no limit); `default` where it is absent or unreadable."""
    try:
        text = path.read_text().strip()
    except OSError:
        return default
    if text == "max":
        return NO_LIMIT
    try:
        return int(text)
    except ValueError:
        return default
