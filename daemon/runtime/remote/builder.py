"""Build the drafter side from a model directory (what a drafter actor does on its node)."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from daemon.runtime.errors import SpecError
from daemon.runtime.model import load_model
from daemon.runtime.parallel.group import TensorParallel
from daemon.runtime.parallel.leader import as_leader
from daemon.runtime.proposers.base import Proposer
from daemon.runtime.proposers.draft_model import (
    DEFAULT_BRANCH_WIDTH,
    DEFAULT_MAX_BRANCH_K,
    DEFAULT_MAX_BRANCHES,
    DraftModelProposer,
)
from daemon.runtime.proposers.ngram import NgramProposer
from daemon.runtime.remote.draft_server import DraftServer
from daemon.runtime.sampling.quantized import MAX_LISTED


@dataclass(slots=True)
class DraftServerSpec:
    draft: Path | None  # a draft model directory; None: n-gram lookup (no model)
    num_slots: int = 16  # the verifier's max batch size (slots are shared numbering)
    max_model_len: int | None = None  # the verifier's context length
    dtype: str = "auto"
    device: str = "cpu"
    backend: str = "auto"  # "auto" | "lean" | "hf" (hf: no fork rows, main branch only)
    sparse_top_k: int = 32  # support of a sampled draft's proposal
    sparse_mass: float = 1.0  # ...listing no more than it takes to cover this much mass
    sparse_max_listed: int | None = None  # ...widening up to this (None: no widening)
    max_prefill_tokens: int | None = None  # None: the device's default (prefill_budget)
    # prompt tokens a round feeds while others draft (None: a prompt in whole at first drafts)
    prefill_chunk_tokens: int | None = None
    branch_width: int = DEFAULT_BRANCH_WIDTH  # guesses considered per position
    max_branches: int = DEFAULT_MAX_BRANCHES  # rows per sequence when preparing
    max_branch_k: int = DEFAULT_MAX_BRANCH_K  # drafts per prepared branch, at most
    tp: TensorParallel | None = None  # this process is rank 0 of the draft's TP group


def build_draft_proposer(
    spec: DraftServerSpec, progress: Callable[[int, int], None] | None = None
) -> Proposer:
    """The drafter's proposer; `progress(bytes loaded, bytes in all)` while weights load."""
    if spec.draft is None:
        return NgramProposer(branch_width=spec.branch_width)
    if not 0 <= spec.sparse_top_k <= MAX_LISTED:
        raise SpecError(
            f"sparse_top_k must be in [0, {MAX_LISTED}] for a remote drafter (what the wire "
            f"carries per draft; 0: the token alone), got {spec.sparse_top_k}"
        )
    if not 0.0 < spec.sparse_mass <= 1.0:
        raise SpecError(f"sparse_mass must be in (0, 1], got {spec.sparse_mass}")
    max_listed = spec.sparse_max_listed
    if max_listed is not None and not spec.sparse_top_k <= max_listed <= MAX_LISTED:
        raise SpecError(
            f"sparse_max_listed must be in [sparse_top_k = {spec.sparse_top_k}, {MAX_LISTED}] "
            f"for a remote drafter (what the wire carries per draft), got {max_listed}"
        )
    model = load_model(
        spec.draft,
        dtype=spec.dtype,
        device=spec.device,
        num_slots=spec.num_slots,
        max_model_len=spec.max_model_len,
        backend=spec.backend,
        progress=progress,
        tp=spec.tp,
    )
    return DraftModelProposer(
        as_leader(model),
        sparse_top_k=spec.sparse_top_k,
        sparse_mass=spec.sparse_mass,
        max_listed=max_listed,
        max_prefill_tokens=spec.max_prefill_tokens,
        prefill_chunk_tokens=spec.prefill_chunk_tokens,
        branch_width=spec.branch_width,
        max_branches=spec.max_branches,
        max_branch_k=spec.max_branch_k,
    )


def build_draft_server(spec: DraftServerSpec, instance_id: int | None = None) -> DraftServer:
    return DraftServer(build_draft_proposer(spec), instance_id=instance_id)
