"""A tensor-parallel group: this rank, the group's size, and the process group that carries its
collectives (gloo on CPU, NCCL on GPU), every collective bounded by the group's timeout."""

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from daemon.runtime.errors import ModelLoadError

DEFAULT_TIMEOUT_S = 60.0
# how long a rank that has loaded its shard waits for the others to load theirs: ranks load at
# their own pace (rank 0 also loads the tokenizer and, colocated, the draft), so this first
# wait is bounded by a load's time, not by a collective's
LOAD_TIMEOUT_S = 900.0
GATHER_MAX_BYTES = 4 << 20  # gloo all-reduces up to this size go as an all-gather and a sum


@dataclass(frozen=True, slots=True)
class TensorParallel:
    """Rank `rank` of `size`; `group` is None only for size 1 (no collectives at all)."""

    rank: int
    size: int
    group: Any = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    control_group: Any = None  # gloo: rank 0's commands (the same group when it is gloo)
    backend: str = "gloo"
    load_group: Any = None  # gloo, bounded by the load timeout: the barrier after loading

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} out of range for size {self.size}")

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """`x` summed over the ranks (the partial outputs of row-parallel layers), bitwise the
        same on every rank.

        On gloo, a small tensor is gathered and summed here in rank order: gloo's own
        all-reduce of a decode step's [1, 1, hidden] costs ~2 ms on loopback, an all-gather
        ~0.2 ms (bench/tensor_parallel.py)."""
        if self.size == 1:
            return x
        if self.backend == "gloo" and x.numel() * x.element_size() <= GATHER_MAX_BYTES:
            parts = [torch.empty_like(x) for _ in range(self.size)]
            torch.distributed.all_gather(parts, x.contiguous(), group=self.group)
            return torch.stack(parts).sum(dim=0)
        torch.distributed.all_reduce(x, group=self.group)
        return x


def init_group(
    rank: int,
    size: int,
    address: str,
    *,
    backend: str = "gloo",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    load_timeout_s: float = LOAD_TIMEOUT_S,
) -> TensorParallel:
    """Join the group whose rendezvous is `address` ("host:port", served by rank 0). Every
    collective of the group, the rendezvous included, fails after `timeout_s` instead of
    waiting forever for a rank that is gone; the one wait for every rank to have loaded
    (`wait_for_ranks`) fails after `load_timeout_s`."""
    if size == 1:
        return TensorParallel(0, 1)
    import torch.distributed as dist

    if dist.is_initialized():
        raise ModelLoadError("this process already belongs to a process group")
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://{address}",
            rank=rank,
            world_size=size,
            timeout=timedelta(seconds=timeout_s),
        )
    except (RuntimeError, ValueError) as exc:
        raise ModelLoadError(
            f"tensor-parallel rank {rank} of {size} could not join the group at {address} "
            f"within {timeout_s:.0f} s: {exc}"
        ) from exc
    world = dist.group.WORLD
    control = world if backend == "gloo" else dist.new_group(backend="gloo")
    # gloo bounds a send by its group's timeout too, so a barrier with a longer timeout needs
    # a group of its own
    loaded = dist.new_group(backend="gloo", timeout=timedelta(seconds=load_timeout_s))
    return TensorParallel(rank, size, world, timeout_s, control, backend, loaded)


def wait_for_ranks(tp: TensorParallel) -> None:
    """Return once every rank of the group has called this (each does once its shard is
    loaded); raise ModelLoadError when the group's load timeout passes first, or at once when
    a rank has left the group (its load failed)."""
    if tp.size == 1:
        return
    import torch.distributed as dist

    try:
        dist.barrier(group=tp.load_group)
    except RuntimeError as exc:
        raise ModelLoadError(
            f"tensor-parallel rank {tp.rank} of {tp.size}: waiting for every rank to load its "
            f"shard: {exc}"
        ) from exc


@contextlib.contextmanager
def left_on_failure(tp: TensorParallel | None) -> Iterator[None]:
    """Leave `tp`'s group (if any) when the block raises: the other ranks, waiting for every
    rank to load (`wait_for_ranks`), then fail at once instead of at the load timeout."""
    try:
        yield
    except BaseException:
        if tp is not None:
            leave_group(tp)
        raise


def leave_group(tp: TensorParallel) -> None:
    if tp.size > 1 and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def pick_address(host: str = "127.0.0.1") -> str:
    """A free TCP port on this machine for rank 0's rendezvous (ranks of a group share a node)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return f"{host}:{probe.getsockname()[1]}"
