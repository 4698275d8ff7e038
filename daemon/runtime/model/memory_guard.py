"""Refuse a model the device has no room for, with a message, before allocating it.

A shard allocates its KV cache zero-filled, all at once, then reads its weights. On a GPU an
allocation past the free memory raises; on a CPU, Linux grants it (overcommit) and the
zero-fill then faults in page after page until the kernel's OOM killer ends the process, or
another one on the node, with nothing said. The planner sizes shards from what each node
reported when it planned, but a node's memory can be taken since (another shard, another user,
two local Ray nodes on one machine, each counting all of it): this is the check at the moment
it matters, of the weights and the KV cache together. It keeps HEADROOM of the memory free:
Ray's memory monitor kills workers once a node is 95% full, and a shard still grows after its
load (each pass's activations and logits), so 5% alone would leave it at that edge. Shards
loading at the same moment on one machine each see the same free memory: inside `loading()`,
what a check found room for is recorded for the others until the load ends (load_ledger.py).
"""

import contextlib
import logging
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from daemon.cgroup_memory import cgroup_memory, memory_bytes
from daemon.runtime.errors import ModelLoadError
from daemon.runtime.model.load_ledger import WAIT_S, LoadLedger, Pending

logger = logging.getLogger(__name__)
GIB = float(1 << 30)
HEADROOM = 0.08  # of the device's memory, kept free


@dataclass(frozen=True, slots=True)
class Room:
    free_bytes: int
    total_bytes: int
    where: str  # how a message names it


def room_on(device: torch.device) -> Room | None:
    """What `device` can still allocate; None where it cannot be known (meta, mps)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        # blocks torch's allocator holds but no tensor uses are free to it too
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        if torch.cuda.get_device_properties(device).is_integrated:
            # unified memory (GB10): the driver leaves out page cache the OS would drop
            free = max(free, memory_bytes()[1])
        return Room(free, total, f"{device}")
    if device.type == "cpu":
        total, available = memory_bytes()
        limited = cgroup_memory()
        where = "this node's memory"
        if limited is not None and limited.limit_bytes <= total:
            where += f" (its cgroup's limit: {limited.limit_bytes / GIB:.2f} GiB)"
        return Room(available, total, where)
    return None


def device_key(device: torch.device) -> str:
    """The memory `device` allocates from, as the load ledger names it: the host's ("cpu"),
    of which a unified-memory GPU's is part; a discrete GPU's own. Loads in other cgroups of
    the host count too: where they do not share its limit, the cost is a wait, never a
    refusal (a load that fits alone waits for the others; see load_ledger.py)."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return "cpu" if props.is_integrated else f"cuda-{props.uuid}"
    return device.type


_load: ContextVar[LoadLedger | None] = ContextVar("specctl_load", default=None)


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Around one model's load: the room its checks find stays recorded for the machine's
    other loads until the load ends, loaded or failed."""
    ledger = LoadLedger()
    token = _load.set(ledger)
    try:
        yield
    finally:
        _load.reset(token)
        try:
            ledger.release()
        except OSError as exc:  # its records read as dead now: the flocks went with release
            logger.warning("load ledger %s: %s", ledger.directory, exc)


def allocated(device: torch.device, nbytes: int) -> None:
    """Inside `loading()`: `nbytes` of the load are allocated now (the free memory shows
    them), and no longer counted as still to come for the machine's other loads."""
    ledger = _load.get()
    if ledger is None or nbytes <= 0:
        return
    try:
        ledger.allocated(device_key(device), nbytes)
    except OSError as exc:
        logger.warning("load ledger %s: %s", ledger.directory, exc)


def require_room(
    needed_bytes: int, device: torch.device, what: str, advice: str, wait_s: float = WAIT_S
) -> None:
    """ModelLoadError, saying what needs how much and what to lower, where `device` has less
    than `needed_bytes` free beyond its headroom and what other loads on this machine are
    still to take (waiting up to `wait_s` for those to end where it would fit alone). Inside
    `loading()`, the bytes are recorded for the others until it ends."""
    first = room_on(device)
    if first is None:
        return
    room = first

    def usable() -> int:
        nonlocal room
        room = room_on(device) or room
        return room.free_bytes - int(HEADROOM * room.total_bytes)

    ledger = _load.get()
    claimer = ledger or LoadLedger()
    began = time.monotonic()
    try:
        left, others = claimer.claim(device_key(device), needed_bytes, what, usable, wait_s)
        if ledger is None:
            claimer.release()  # no load to hold it for: checked, not kept
    except OSError as exc:  # the ledger is best effort: the free memory alone, then
        unusable = "load ledger %s unusable (%s): other loads are not counted"
        logger.warning(unusable, claimer.directory, exc)
        left, others = usable(), []
    if needed_bytes > left:
        raise ModelLoadError(
            f"{what} needs {needed_bytes / GIB:.2f} GiB and {room.where} has "
            f"{room.free_bytes / GIB:.2f} GiB free, less {HEADROOM:.0%} of its "
            f"{room.total_bytes / GIB:.2f} GiB kept free"
            f"{_taken(others, time.monotonic() - began)}: {advice}"
        )


def _taken(others: list[Pending], waited_s: float) -> str:
    """The loads under way that a refusal counted, and how long it waited for them, for its
    message."""
    if not others:
        return ""
    total = sum(o.nbytes for o in others)
    named = "; ".join(f"pid {o.pid}: {o.nbytes / GIB:.2f} GiB" for o in others[:3])
    more = f"; {len(others) - 3} more" if len(others) > 3 else ""
    waited = f", waited for {waited_s:.0f} s" if waited_s >= 1 else ""
    return (
        f", and {total / GIB:.2f} GiB of it still to be taken by loads under way on this "
        f"machine ({named}{more}{waited})"
    )
