"""Rank 0's calls to the other ranks of a tensor-parallel group: one pickled command per call,
broadcast over the group's control channel (gloo, CPU), bounded by the group's timeout."""

from typing import Any

import torch.distributed as dist

from daemon.runtime.errors import SpecError
from daemon.runtime.parallel.group import TensorParallel

# The calls a follower replays: the whole surface of a CausalLM that the engine uses.
MODEL_CALLS = frozenset({"forward", "free_slot", "enable_forks", "promote"})
NOOP = "noop"  # keeps an idle group inside its timeout
STOP = "stop"

Command = tuple[str, tuple[Any, ...]]


class ParallelGroupError(SpecError):
    """A rank of a tensor-parallel group is gone or silent past the group's timeout."""


def send(tp: TensorParallel, command: Command) -> None:
    dist.broadcast_object_list([command], src=0, group=tp.control_group)


def receive(tp: TensorParallel) -> Command:
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0, group=tp.control_group)
    op, args = box[0]
    if op not in MODEL_CALLS and op not in (NOOP, STOP):
        raise ParallelGroupError(f"rank {tp.rank}: unknown command {op!r} from rank 0")
    return op, tuple(args)
