"""Rank 0 of a tensor-parallel model, as the engine sees it: an ordinary CausalLM.

Rank 0 decides everything (which sequences run, how many tokens each drafts, k = 0 included);
every call the engine makes on the model is first broadcast to the other ranks, which replay
it (follower.py). The ranks therefore run the same calls, and so the same collectives, in the
same order, whatever the round holds: a round in which nobody drafts is a call that is not
made, on any rank. Nothing a follower decides on its own can leave a collective unmatched,
which is how vLLM's "distributed draft workers generate no tokens" and idle-rank hangs cannot
happen here.

A group starts with a barrier that every rank reaches once its shard is loaded, bounded by a
load timeout: the ranks load at their own pace, and a follower that is ready first must not
spend the group's collective timeout waiting for rank 0's first command.

While the engine is idle, a heartbeat sends no-ops so that followers waiting for the next
command stay inside the group's timeout; a rank that dies makes the next call fail within that
timeout, and every later call fail at once, with a ParallelGroupError naming the group.
"""

import logging
import threading
import time
from typing import Any

import torch

from daemon.runtime.model.batch import ForwardBatch
from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.runtime.model.protocol import CausalLM
from daemon.runtime.parallel.channel import NOOP, STOP, Command, ParallelGroupError, send
from daemon.runtime.parallel.group import TensorParallel, leave_group, wait_for_ranks

log = logging.getLogger(__name__)


class TensorParallelLM:
    """The engine's handle on rank 0 of `model`'s tensor-parallel group."""

    supports_forks = True

    def __init__(self, model: LlamaForCausalLM, heartbeat_s: float | None = None) -> None:
        # the followers wait for the first command within the group's timeout, counted from
        # here: nothing is sent before every rank has loaded (ModelLoadError otherwise)
        wait_for_ranks(model.tp)
        self.model = model
        self.tp: TensorParallel = model.tp
        self.vocab_size = model.vocab_size
        self.max_model_len = model.max_model_len
        self.num_slots = model.num_slots
        self.device: torch.device = model.device
        self.dtype: torch.dtype = model.dtype
        self.config = model.config
        self._lock = threading.Lock()
        self._broken: str | None = None
        self._closed = threading.Event()
        self._last_sent = time.monotonic()
        self._heartbeat_s = heartbeat_s if heartbeat_s is not None else self.tp.timeout_s / 4
        self._heartbeat = threading.Thread(target=self._beat, name="tp-heartbeat", daemon=True)
        self._heartbeat.start()

    # -- the CausalLM surface -------------------------------------------------------------
    def forward(self, batch: ForwardBatch) -> torch.Tensor | None:
        return self._call("forward", batch)

    def free_slot(self, slot: int) -> None:
        # the lean runner keeps nothing per slot to release (the next user overwrites it): no
        # call to replay, and so it works on a broken group too (engine.fail_all frees slots)
        self.model.free_slot(slot)

    def enable_forks(self, num_branch_slots: int, branch_len: int) -> None:
        self._call("enable_forks", num_branch_slots, branch_len)

    def promote(self, branch_slot: int, parent_slot: int, fork_position: int, length: int) -> None:
        self._call("promote", branch_slot, parent_slot, fork_position, length)

    # -- lifetime ---------------------------------------------------------------------------
    @property
    def broken(self) -> str | None:
        """Why the group can no longer run, or None while it can."""
        return self._broken

    def close(self) -> None:
        """Tell the followers to stop, then leave the group. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            if self._broken is None:
                try:
                    send(self.tp, (STOP, ()))
                except RuntimeError as exc:
                    log.warning("tensor-parallel stop not delivered: %s", exc)
        self._heartbeat.join(timeout=self._heartbeat_s + 1.0)
        leave_group(self.tp)

    # -- inside -------------------------------------------------------------------------------
    def _call(self, op: str, *args: Any) -> Any:
        with self._lock:
            self._check_usable()
            self._send((op, args))
            try:
                return getattr(self.model, op)(*args)
            except RuntimeError as exc:  # a collective failed: a rank is gone or silent
                raise self._fail(f"{op} failed: {exc}") from exc

    def _send(self, command: Command) -> None:
        try:
            send(self.tp, command)
        except RuntimeError as exc:
            raise self._fail(f"cannot reach the other ranks: {exc}") from exc
        self._last_sent = time.monotonic()

    def _check_usable(self) -> None:
        if self._closed.is_set():
            raise ParallelGroupError("the tensor-parallel group is closed")
        if self._broken is not None:
            raise ParallelGroupError(self._broken)

    def _fail(self, why: str) -> ParallelGroupError:
        self._broken = f"tensor-parallel group of {self.tp.size} ranks is down: {why}"
        log.error("%s", self._broken)
        return ParallelGroupError(self._broken)

    def _beat(self) -> None:
        while not self._closed.wait(self._heartbeat_s / 2):
            if time.monotonic() - self._last_sent < self._heartbeat_s:
                continue
            with self._lock:
                if self._broken is not None or self._closed.is_set():
                    return
                try:
                    self._send((NOOP, ()))
                except ParallelGroupError:
                    return


def as_leader(model: CausalLM) -> CausalLM:
    """Rank 0 of a tensor-parallel model is driven through its leader (every call replayed on
    the other ranks); any other model is used as it is."""
    if isinstance(model, LlamaForCausalLM) and model.tp.size > 1:
        return TensorParallelLM(model)
    return model


def close_leader(model: object) -> None:
    """Stop the other ranks of `model`'s group, if it leads one."""
    if isinstance(model, TensorParallelLM):
        model.close()
