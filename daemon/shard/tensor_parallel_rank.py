"""A tensor-parallel rank other than 0, as a Ray actor on rank 0's node: it loads its shard of
the model and replays rank 0's calls until rank 0 stops it (daemon/runtime/parallel).

`run` blocks for the rank's whole life (call it once; `status` answers meanwhile on a second
thread). It returns when rank 0 sends stop and raises when rank 0 is gone or silent past the
group's timeout, so a rank never outlives its group for long."""

import logging

import torch

from daemon.runtime.errors import SpecError
from daemon.runtime.model import load_model
from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.runtime.parallel.follower import follow
from daemon.runtime.parallel.group import init_group
from daemon.shard.node_context import NodeContext
from daemon.shard.specs import RankSpec

logger = logging.getLogger(__name__)


class TensorParallelRank:
    def __init__(self, spec: RankSpec) -> None:
        if spec.num_threads:
            torch.set_num_threads(spec.num_threads)
        self.spec = spec
        self.context = NodeContext.current()
        self.state = "starting"
        self.error: str | None = None
        self.calls = 0

    def run(self) -> int:
        """Join rank 0's group, load this rank's shard, follow; the number of calls replayed."""
        spec = self.spec
        try:
            tp = init_group(spec.rank, spec.size, spec.address, timeout_s=spec.timeout_s)
            self.state = "loading"
            model = load_model(
                spec.model_dir,
                dtype=spec.dtype,
                num_slots=spec.num_slots,
                max_model_len=spec.max_model_len,
                backend="lean",
                tp=tp,
            )
            assert isinstance(model, LlamaForCausalLM)
            self.state = "ready"
            logger.info("rank %d of %d ready (%s)", spec.rank, spec.size, spec.model_dir)
            self.calls = follow(model)
        except SpecError as exc:
            self.state, self.error = "failed", str(exc)
            logger.error("rank %d of %d: %s", spec.rank, spec.size, exc)
            raise
        self.state = "stopped"
        return self.calls

    def status(self) -> dict[str, object]:
        return {
            "rank": self.spec.rank,
            "state": self.state,
            "error": self.error,
            "node_name": self.context.node_name,
            "node_id": self.context.node_id,
            "pid": self.context.pid,
        }
