"""Ranks 1..N-1 of a tensor-parallel model: replay rank 0's calls until it says stop."""

import logging

from daemon.runtime.errors import SpecError
from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.runtime.parallel.channel import NOOP, STOP, ParallelGroupError, receive
from daemon.runtime.parallel.group import leave_group, wait_for_ranks

log = logging.getLogger(__name__)


def follow(model: LlamaForCausalLM) -> int:
    """Run rank 0's calls on this rank's shard until rank 0 sends stop; returns the number of
    calls replayed. First waits (within the group's load timeout) for every rank to load; then
    raises ParallelGroupError when rank 0 is gone or silent past the group's timeout (its
    heartbeat keeps an idle group inside it)."""
    tp = model.tp
    calls = 0
    try:
        wait_for_ranks(tp)
        while True:
            try:
                op, args = receive(tp)
            except RuntimeError as exc:
                raise ParallelGroupError(
                    f"rank {tp.rank} of {tp.size}: lost rank 0: {exc}"
                ) from exc
            if op == STOP:
                return calls
            if op == NOOP:
                continue
            calls += 1
            try:
                getattr(model, op)(*args)
            except SpecError as exc:
                # rank 0 ran the same call on the same input: it raised the same error before
                # any collective, and tells its caller; the group goes on
                log.debug("rank %d: %s refused: %s", tp.rank, op, exc)
            except RuntimeError as exc:
                raise ParallelGroupError(
                    f"rank {tp.rank} of {tp.size}: {op} failed: {exc}"
                ) from exc
    finally:
        leave_group(tp)
