"""Per-round statistics: what the metrics layer publishes (vLLM's spec-decode names map 1:1)."""

from dataclasses import dataclass, field


@dataclass(slots=True)
class RoundStats:
    """One engine step: admission/prefill plus one speculation round over the running batch."""

    batch_size: int = 0  # sequences in the verify pass
    num_prefill_seqs: int = 0
    num_prefill_tokens: int = 0
    num_drafts: int = 0  # sequences that got >= 1 draft token (vllm:spec_decode_num_drafts)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # [K] accepted at position i
    num_emitted_tokens: int = 0  # tokens appended to outputs (accepted + bonus/correction)
    speculation_len: int = 0  # max k asked for this round
    prefill_time_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    choose_time_s: float = 0.0  # the controller choosing k (part of the overhead)
    hand_out_time_s: float = 0.0  # handing the prefill's first tokens out (step's on_prefilled)
    step_time_s: float = 0.0  # the whole step

    @property
    def round_time_s(self) -> float:
        """The step less its prefill and the hand-out of first tokens: what the round cost."""
        return max(0.0, self.step_time_s - self.prefill_time_s - self.hand_out_time_s)

    @property
    def overhead_time_s(self) -> float:
        """The round's time outside the model forward passes (scheduling, sampling,
        bookkeeping)."""
        return max(0.0, self.round_time_s - self.draft_time_s - self.verify_time_s)


@dataclass(slots=True)
class EngineStats:
    """Running totals over many rounds."""

    num_rounds: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    prefill_time_s: float = 0.0
    choose_time_s: float = 0.0
    step_time_s: float = 0.0

    def add(self, r: RoundStats) -> None:
        self.num_rounds += 1
        self.num_drafts += r.num_drafts
        self.num_draft_tokens += r.num_draft_tokens
        self.num_accepted_tokens += r.num_accepted_tokens
        self.num_emitted_tokens += r.num_emitted_tokens
        if len(self.accepted_per_pos) < len(r.accepted_per_pos):
            self.accepted_per_pos.extend(
                [0] * (len(r.accepted_per_pos) - len(self.accepted_per_pos))
            )
        for i, n in enumerate(r.accepted_per_pos):
            self.accepted_per_pos[i] += n
        self.draft_time_s += r.draft_time_s
        self.verify_time_s += r.verify_time_s
        self.prefill_time_s += r.prefill_time_s
        self.choose_time_s += r.choose_time_s
        self.step_time_s += r.step_time_s

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per draft round, bonus included (vLLM's definition: 1 + accepted / drafts)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def overhead_time_s(self) -> float:
        return max(
            0.0, self.step_time_s - self.prefill_time_s - self.draft_time_s - self.verify_time_s
        )
