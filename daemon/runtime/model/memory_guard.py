"""Refuse an allocation the device has no room for, with a message, before making it.

A KV cache is allocated zero-filled, all at once, when a shard loads. On a GPU an allocation
past the free memory raises; on a CPU, Linux grants it (overcommit) and the zero-fill then
faults in page after page until the kernel's OOM killer ends the process, or another one on
the node, with nothing said. The planner sizes shards from what each node reported when it
planned, but a node's memory can be taken since (another shard, another user, two local Ray
nodes on one machine, each counting all of it): this is the check at the moment it matters.
"""

import torch

from daemon.cgroup_memory import memory_bytes
from daemon.runtime.errors import ModelLoadError

GIB = float(1 << 30)


def free_bytes(device: torch.device) -> int | None:
    """What `device` can still allocate: a GPU's free memory, the host's available memory
    (within this process's cgroup limit) for a CPU; None where it cannot be known."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        return memory_bytes()[1]
    return None


def require_room(needed_bytes: int, device: torch.device, what: str, advice: str) -> None:
    """ModelLoadError, saying what needs how much and what to lower, where `device` has less
    than `needed_bytes` free."""
    free = free_bytes(device)
    if free is not None and needed_bytes > free:
        where = "this node's memory" if device.type == "cpu" else f"{device}"
        raise ModelLoadError(
            f"{what} needs {needed_bytes / GIB:.2f} GiB and {where} has {free / GIB:.2f} GiB "
            f"free: {advice}"
        )
