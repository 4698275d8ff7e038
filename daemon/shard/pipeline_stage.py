"""A later stage of a pipeline-parallel verifier, as a Ray actor on its own node: its layers
(and, for the last stage, the final norm and the LM head) with their KV cache. The verifier's
process holds the first stage and calls this one once per model call (PipelineLM); it loads
on a thread of its own, `status`/`wait_ready` answer meanwhile."""

import logging
from dataclasses import dataclass
from typing import Any

import torch

from daemon.runtime.model import load_model
from daemon.runtime.model.batch import ForwardBatch
from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.shard.background_load import BackgroundLoad, Progress
from daemon.shard.node_context import NodeContext
from daemon.shard.specs import ShardStatus, StageSpec

logger = logging.getLogger(__name__)


class PipelineStageShard:
    def __init__(self, spec: StageSpec) -> None:
        if spec.num_threads:
            torch.set_num_threads(spec.num_threads)
        self.spec = spec
        self.context = NodeContext.current()
        self._load = BackgroundLoad(self._build, "stage")

    def _build(self, progress: Progress) -> LlamaForCausalLM:
        spec = self.spec
        model = load_model(
            spec.model_dir,
            dtype=spec.dtype,
            num_slots=spec.num_slots,
            max_model_len=spec.max_model_len,
            backend="lean",
            progress=progress,
            layers=spec.layers,
        )
        assert isinstance(model, LlamaForCausalLM)
        start, end = spec.layers
        logger.info("stage layers %d-%d ready on %s", start, end - 1, self.context.node_name)
        return model

    # -- calls from the control plane -------------------------------------------------------
    def status(self) -> ShardStatus:
        return self._load.report("stage", self.context)

    def wait_ready(self, timeout_s: float) -> ShardStatus:
        self._load.wait(timeout_s)
        return self.status()

    def stop(self) -> None:
        self._load.stop()

    # -- calls from the first stage (the verifier) ----------------------------------------------
    def forward(self, batch: ForwardBatch, hidden: torch.Tensor) -> torch.Tensor | None:
        """The previous stage's hidden states [B, T, hidden] -> this stage's (or the logits)."""
        return self._load.get().forward(batch, hidden)

    def enable_forks(self, num_branch_slots: int, branch_len: int) -> None:
        self._load.get().enable_forks(num_branch_slots, branch_len)

    def promote(self, branch_slot: int, parent_slot: int, fork_position: int, length: int) -> None:
        self._load.get().promote(branch_slot, parent_slot, fork_position, length)


@dataclass(slots=True)
class RayStage:
    """A `Stage` of PipelineLM reached through its actor; every call bounded by `timeout_s`."""

    name: str
    handle: Any
    timeout_s: float

    def forward(self, batch: ForwardBatch, hidden: torch.Tensor) -> torch.Tensor | None:
        return self._call("forward", batch, hidden)

    def enable_forks(self, num_branch_slots: int, branch_len: int) -> None:
        self._call("enable_forks", num_branch_slots, branch_len)

    def promote(self, branch_slot: int, parent_slot: int, fork_position: int, length: int) -> None:
        self._call("promote", branch_slot, parent_slot, fork_position, length)

    def _call(self, op: str, *args: Any) -> Any:
        import ray

        return ray.get(getattr(self.handle, op).remote(*args), timeout=self.timeout_s)
