"""A pipeline-parallel model, as the engine sees it from its first stage: an ordinary CausalLM.

The verifier's process holds the first stage (the embedding and the first layers); each later
stage (its layers, and for the last the final norm and the LM head) runs elsewhere, reached
through a `Stage` (a Ray actor on another node, see daemon/shard/pipeline_stage.py). A call
runs the stages in order, passing hidden states [B, T, hidden] from one to the next; every
stage keeps the KV cache of its own layers, so the engine's rollback (moving a length) and
slot reuse stay per stage without any message. A stage that fails or does not answer within
its timeout breaks the pipeline: that call and every later one fail with a PipelineError that
names the stage.
"""

from typing import Any, Protocol

import torch

from daemon.runtime.errors import RequestError, SpecError
from daemon.runtime.model.batch import ForwardBatch
from daemon.runtime.model.llama import LlamaForCausalLM


class PipelineError(SpecError):
    """A stage of a pipeline-parallel model is gone or did not answer in time."""


class Stage(Protocol):
    """A later stage of the pipeline (every call bounded by its own timeout)."""

    name: str  # e.g. "stage 1 (layers 4-5) on gpu-node": for messages

    def forward(self, batch: ForwardBatch, hidden: torch.Tensor) -> torch.Tensor | None: ...

    def enable_forks(self, num_branch_slots: int, branch_len: int) -> None: ...

    def promote(
        self, branch_slot: int, parent_slot: int, fork_position: int, length: int
    ) -> None: ...


class PipelineLM:
    """The first stage `first` followed by `stages`, as one CausalLM."""

    supports_forks = True

    def __init__(self, first: LlamaForCausalLM, stages: list[Stage]) -> None:
        if not first.is_first or first.is_last or not stages:
            raise ValueError("a pipeline needs its first stage here and at least one more")
        self.first = first
        self.stages = stages
        self.vocab_size = first.vocab_size
        self.max_model_len = first.max_model_len
        self.num_slots = first.num_slots
        self.device: torch.device = first.device
        self.dtype: torch.dtype = first.dtype
        self.config = first.config
        self._broken: str | None = None

    @property
    def broken(self) -> str | None:
        """Why the pipeline can no longer run, or None while it can."""
        return self._broken

    def forward(self, batch: ForwardBatch) -> torch.Tensor | None:
        self._check_usable()
        # [B, T, hidden]
        hidden = self.first.forward(batch)
        assert hidden is not None
        for stage in self.stages:
            hidden = self._on(stage, "forward", batch, hidden)
        return hidden

    def free_slot(self, slot: int) -> None:
        # no stage keeps anything per slot to release (the next user overwrites it)
        self.first.free_slot(slot)

    def enable_forks(self, num_branch_slots: int, branch_len: int) -> None:
        self._check_usable()
        self.first.enable_forks(num_branch_slots, branch_len)
        for stage in self.stages:
            self._on(stage, "enable_forks", num_branch_slots, branch_len)

    def promote(self, branch_slot: int, parent_slot: int, fork_position: int, length: int) -> None:
        self._check_usable()
        self.first.promote(branch_slot, parent_slot, fork_position, length)
        for stage in self.stages:
            self._on(stage, "promote", branch_slot, parent_slot, fork_position, length)

    def _on(self, stage: Stage, op: str, *args: Any) -> Any:
        try:
            return getattr(stage, op)(*args)
        except RequestError:
            raise  # the same checks ran on the first stage: not reached in practice
        except Exception as exc:  # the stage died, timed out or failed: the pipeline is down
            self._broken = f"pipeline {stage.name} is down: {exc}"
            raise PipelineError(self._broken) from exc

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise PipelineError(self._broken)
