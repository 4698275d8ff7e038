"""The drafter shard: a proposer (draft model or n-gram) and its KV cache, on a node of its own,
serving one verifier's draft requests.

It loads on a thread of its own (status answers meanwhile) and then serves `handle(bytes) ->
bytes`, the wire protocol of daemon/runtime/remote (deltas of committed tokens in, drafts and
prepared branches out). Run as a Ray actor with max_concurrency 1, so that one verifier's calls
are handled one at a time in the order they were sent. While it loads (or after it failed),
`handle` raises: the verifier's remote proposer counts that as "no drafter", decodes with k = 0
and asks again later.
"""

import logging
from pathlib import Path

import torch

from daemon.runtime.errors import ModelLoadError
from daemon.runtime.parallel.group import TensorParallel, init_group, left_on_failure, pick_address
from daemon.runtime.parallel.leader import close_leader
from daemon.runtime.proposers.draft_model import DraftModelProposer
from daemon.runtime.remote.builder import DraftServerSpec, build_draft_proposer
from daemon.runtime.remote.draft_server import DraftServer
from daemon.shard.background_load import BackgroundLoad, Progress
from daemon.shard.node_context import NodeContext
from daemon.shard.specs import DrafterSpec, ShardStatus

logger = logging.getLogger(__name__)


class DrafterShard:
    def __init__(self, spec: DrafterSpec) -> None:
        if spec.num_threads:
            torch.set_num_threads(spec.num_threads)
        self.spec = spec
        self.context = NodeContext.current()
        # rank 0 of a tensor-parallel draft: the other ranks (actors on this node) join here
        self.tp_address = pick_address() if spec.tensor_parallel_size > 1 else None
        self._draft_model: object = None
        self._load = BackgroundLoad(self._build, "drafter")

    def _build(self, progress: Progress) -> DraftServer:
        spec = self.spec
        tp = self._join_group()
        with left_on_failure(tp):
            proposer = build_draft_proposer(
                DraftServerSpec(
                    draft=Path(spec.draft_dir) if spec.draft_dir else None,
                    num_slots=spec.max_batch_size,
                    max_model_len=spec.max_model_len,
                    dtype=spec.dtype,
                    sparse_top_k=spec.sparse_top_k,
                    sparse_mass=spec.sparse_mass,
                    sparse_max_listed=spec.sparse_max_listed,
                    prefill_chunk_tokens=spec.prefill_chunk_tokens,
                    tp=tp,
                ),
                progress,
            )
            if isinstance(proposer, DraftModelProposer):
                self._draft_model = proposer.model
            if isinstance(proposer, DraftModelProposer) and spec.target_vocab_size is not None:
                vocab_size = proposer.model.vocab_size
                if vocab_size != spec.target_vocab_size:
                    raise ModelLoadError(
                        f"draft {spec.draft_dir} has a vocabulary of {vocab_size}, the verifier's "
                        f"target {spec.target_vocab_size}: they need the same tokenizer"
                    )
        what = spec.draft_dir or "n-gram lookup"
        logger.info("drafter ready on %s (%s)", self.context.node_name, what)
        return DraftServer(proposer)

    def _join_group(self) -> TensorParallel | None:
        spec = self.spec
        if self.tp_address is None:
            return None
        if spec.draft_dir is None:
            raise ModelLoadError("n-gram lookup has no model to split: tensor_parallel_size 1")
        return init_group(
            0, spec.tensor_parallel_size, self.tp_address, timeout_s=spec.tp_timeout_s
        )

    # -- calls from the control plane -------------------------------------------------------
    def tensor_parallel_address(self) -> str | None:
        """Where the draft's other tensor-parallel ranks join (None: not tensor-parallel)."""
        return self.tp_address

    def status(self) -> ShardStatus:
        return self._load.report("drafter", self.context)

    def wait_ready(self, timeout_s: float) -> ShardStatus:
        self._load.wait(timeout_s)
        return self.status()

    def stop(self) -> None:
        close_leader(self._draft_model)
        self._load.stop()

    # -- calls from the verifier ------------------------------------------------------------
    def handle(self, payload: bytes) -> bytes:
        """One draft request's bytes -> its reply's bytes (NotReadyError while loading)."""
        return self._load.get().handle(payload)
