"""Engine settings, checked when built."""

from dataclasses import dataclass

from daemon.runtime.errors import RequestError

MAX_SPECULATIVE_TOKENS = 16


@dataclass(slots=True)
class EngineConfig:
    max_batch_size: int = 16  # running sequences (KV-cache slots)
    num_speculative_tokens: int = 4  # k in fixed mode; the ceiling in adaptive mode
    adaptive: bool = False
    # support of the sampled draft's proposal sent to the verifier; 0: coupled drafting (the
    # token alone, matched by the verifier: proposers/draft_sampling.py)
    draft_sparse_top_k: int = 32
    # list no more of the draft's best tokens than it takes to cover this much of its mass
    draft_sparse_mass: float = 1.0
    # a row's list widens up to this many tokens while the verifier rejects the drafts drawn
    # from the tail (proposers/tail_verdicts.py); None: draft_sparse_top_k (no widening)
    draft_sparse_max_listed: int | None = None
    # with listed proposals (draft_sparse_top_k > 0): measure them against coupled drafts for
    # sampled rows and keep the faster, per batch size (engine/proposal_chooser.py)
    choose_proposal: bool = True
    # prompt tokens prefilled together in one padded pass; None: the device's default
    # (model.batch.prefill_budget: 512 on a CPU, 8192 on a GPU)
    max_prefill_tokens: int | None = None
    # prompt tokens a step prefills, at most, while other sequences decode (the rest of a
    # prompt goes in over the next steps); None: every admitted prompt whole, at once
    prefill_chunk_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise RequestError(f"max batch size must be >= 1, got {self.max_batch_size}")
        if not 0 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise RequestError(
                f"num_speculative_tokens must be in [0, {MAX_SPECULATIVE_TOKENS}], "
                f"got {self.num_speculative_tokens}"
            )
        if self.draft_sparse_top_k < 0:
            raise RequestError(f"draft sparse top-k must be >= 0, got {self.draft_sparse_top_k}")
        if not 0.0 < self.draft_sparse_mass <= 1.0:
            raise RequestError(f"draft sparse mass must be in (0, 1], got {self.draft_sparse_mass}")
        if self.draft_sparse_max_listed is not None and (
            self.draft_sparse_max_listed < self.draft_sparse_top_k
        ):
            raise RequestError(
                f"draft sparse max listed ({self.draft_sparse_max_listed}) must be >= the "
                f"draft sparse top-k ({self.draft_sparse_top_k})"
            )
        if self.max_prefill_tokens is not None and self.max_prefill_tokens < 1:
            raise RequestError(f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")
        if self.prefill_chunk_tokens is not None and self.prefill_chunk_tokens < 1:
            raise RequestError(
                f"prefill_chunk_tokens must be >= 1, got {self.prefill_chunk_tokens}"
            )
