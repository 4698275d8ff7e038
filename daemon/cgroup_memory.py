"""The memory this process may use: the machine's, or less where its cgroup limits it.

Inside a container (Docker `--memory`, a Kubernetes pod's limit, a systemd slice) /proc/meminfo
still shows the whole machine: a node that reported it would be planned shards it cannot hold,
and a shard that allocated its KV cache by it would be killed by the kernel's OOM killer
part-way through, with no message. The limit is the cgroup's (v2: memory.max; v1:
memory.limit_in_bytes and the hierarchical limit it enforces), the tightest of the process's
cgroup and its ancestors up to the mount; the room is the least, over those levels that have a
limit, of the limit less what the level uses (a parent's limit holds for all its children
together), its file pages not mapped by a process counted as room, as MemAvailable counts
them. No torch here: specd reads it too.
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
    room_bytes: int  # what the process may still take: the least room of any level limited
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
    return min(total, limited.limit_bytes), min(available, limited.room_bytes)


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
    """(the process's cgroup directory, its mount point) for the memory controller: of the
    mounts of that hierarchy, the one whose root holds the process's cgroup most closely."""
    path = None
    for line in memberships:
        number, _, rest = line.partition(":")
        controllers, _, where = rest.partition(":")
        v1_memory = version == 1 and "memory" in controllers.split(",")
        if v1_memory or (version == 2 and number == "0" and controllers == ""):
            path = where
    if path is None:
        return None
    best: tuple[int, Path, Path] | None = None  # (root depth, directory, mount point)
    for line in mounts:
        if " - " not in line:
            continue
        fields, after = line.split(" - ", 1)[0].split(), line.split(" - ", 1)[1].split()
        if len(fields) < 5 or not after:
            continue
        fstype, options = after[0], after[2].split(",") if len(after) > 2 else []
        if not (
            (version == 1 and fstype == "cgroup" and "memory" in options)
            or (version == 2 and fstype == "cgroup2")
        ):
            continue
        root, mount_point = _unescape(fields[3]), Path(_unescape(fields[4]))
        root_parts, path_parts = Path(root).parts, Path(path).parts
        if path_parts[: len(root_parts)] == root_parts:
            directory = mount_point.joinpath(*path_parts[len(root_parts) :])
            depth = len(root_parts)
        else:  # a cgroup namespace: the process's cgroup is the mount's root
            directory, depth = mount_point, -1
        if not directory.is_dir():
            directory = mount_point
        if best is None or depth > best[0]:
            best = (depth, directory, mount_point)
    return None if best is None else (best[1], best[2])


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


def _read(directory: Path, mount_point: Path, version: int) -> CgroupMemory | None:
    """The limit and the room at each level from the process's cgroup up to the mount (a
    parent's limit holds for all its children together)."""
    limit_file, usage_file, prefix = (
        ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_")
        if version == 1
        else ("memory.max", "memory.current", "")
    )
    limit = room = NO_LIMIT
    at = directory
    while True:
        level_limit = _number(at / limit_file)
        stat = _stat(at / "memory.stat")
        if version == 1 and at == directory:  # what v1 enforces, with or without use_hierarchy
            level_limit = min(level_limit, stat.get("hierarchical_memory_limit", NO_LIMIT))
        if level_limit < NO_LIMIT:
            # its file pages the kernel can drop count as room, as MemAvailable counts them
            # (not those mapped by a process)
            file = stat.get(prefix + "inactive_file", 0) + stat.get(prefix + "active_file", 0)
            mapped = stat.get(prefix + ("mapped_file" if version == 1 else "file_mapped"), 0)
            used = max(0, _number(at / usage_file, default=0) - max(0, file - mapped))
            limit, room = min(limit, level_limit), min(room, max(0, level_limit - used))
        if at == mount_point or at.parent == at:
            break
        at = at.parent
    if limit >= NO_LIMIT:
        return None
    return CgroupMemory(limit, room, directory)


def _stat(path: Path) -> dict[str, int]:
    values: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                values[key] = int(value)
    return values


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
