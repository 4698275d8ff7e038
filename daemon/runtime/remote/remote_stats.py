"""What the remote proposer measures, per round and in total (for benchmarks and metrics).

A sequence-round is one sequence asking for drafts in one round. In overlapped mode, its
verdict on the previous proposal either matches a prepared branch (a hit: the drafts are
already here, no round trip) or not (a miss: drafted afresh). Verdict kinds: "all" (every
draft accepted; the branch guessed the bonus token) or "a=<n>" (n accepted, then a correction).
"""

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class RemoteRoundStats:
    num_seqs: int = 0  # sequences asking for drafts (k > 0)
    num_with_branches: int = 0  # of those, with prepared branches to match their verdict
    num_hits: int = 0  # verdicts matching a prepared branch
    num_fresh: int = 0  # sequences drafted afresh (a call with a round trip)
    num_skipped: int = 0  # misses left without drafts this round (miss policy SKIP / AUTO)
    num_hidden_drafts: int = 0  # draft tokens served from prepared branches
    num_draft_tokens: int = 0  # draft tokens returned to the engine
    propose_time_s: float = 0.0  # the whole propose() call
    wait_s: float = 0.0  # blocked on the drafter (network + draft time actually paid)
    prepare_wait_s: float = 0.0  # part of wait_s spent waiting for prepared branches
    bytes_sent: int = 0
    bytes_received: int = 0
    drafter_draft_s: float = 0.0  # drafter's own time proposing (from its replies)
    drafter_prepare_s: float = 0.0  # drafter's own time preparing branches
    branch_budget: int = 0  # branches per sequence asked to prepare this round
    is_without_drafter: bool = False  # no drafter: the round ran with k = 0
    is_resync: bool = False  # the drafter came back: every sequence was re-admitted
    num_slot_resyncs: int = 0  # single slots re-admitted after an error for them
    outcomes: Counter = field(default_factory=Counter)  # verdict kind -> sequence-rounds
    hits: Counter = field(default_factory=Counter)  # verdict kind -> hits
    hits_by_rank: Counter = field(default_factory=Counter)  # guess rank (0 = best) -> hits


@dataclass(slots=True)
class RemoteStats:
    num_rounds: int = 0
    num_seq_rounds: int = 0
    num_with_branches: int = 0
    num_hits: int = 0
    num_fresh: int = 0
    num_skipped: int = 0
    num_hidden_drafts: int = 0
    num_draft_tokens: int = 0
    propose_time_s: float = 0.0
    wait_s: float = 0.0
    prepare_wait_s: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    drafter_draft_s: float = 0.0
    drafter_prepare_s: float = 0.0
    num_rounds_without_drafter: int = 0
    num_resyncs: int = 0
    num_slot_resyncs: int = 0
    num_drafter_losses: int = 0
    branch_budget_sum: int = 0  # over rounds that asked for branches
    num_prepare_rounds: int = 0
    outcomes: Counter = field(default_factory=Counter)
    hits: Counter = field(default_factory=Counter)
    hits_by_rank: Counter = field(default_factory=Counter)
    last_round: RemoteRoundStats = field(default_factory=RemoteRoundStats)

    def add(self, r: RemoteRoundStats) -> None:
        self.last_round = r
        self.num_rounds += 1
        self.num_seq_rounds += r.num_seqs
        self.num_with_branches += r.num_with_branches
        self.num_hits += r.num_hits
        self.num_fresh += r.num_fresh
        self.num_skipped += r.num_skipped
        self.num_hidden_drafts += r.num_hidden_drafts
        self.num_draft_tokens += r.num_draft_tokens
        self.propose_time_s += r.propose_time_s
        self.wait_s += r.wait_s
        self.prepare_wait_s += r.prepare_wait_s
        self.bytes_sent += r.bytes_sent
        self.bytes_received += r.bytes_received
        self.drafter_draft_s += r.drafter_draft_s
        self.drafter_prepare_s += r.drafter_prepare_s
        self.num_rounds_without_drafter += int(r.is_without_drafter)
        self.num_resyncs += int(r.is_resync)
        self.num_slot_resyncs += r.num_slot_resyncs
        if r.branch_budget:
            self.branch_budget_sum += r.branch_budget
            self.num_prepare_rounds += 1
        self.outcomes.update(r.outcomes)
        self.hits.update(r.hits)
        self.hits_by_rank.update(r.hits_by_rank)

    @property
    def hit_rate(self) -> float:
        """h: share of sequence-rounds with prepared branches whose verdict matched one."""
        return self.num_hits / self.num_with_branches if self.num_with_branches else 0.0

    @property
    def bytes_per_seq_round(self) -> float:
        """Bytes both ways per sequence-round (admits and resyncs included)."""
        total = self.bytes_sent + self.bytes_received
        return total / self.num_seq_rounds if self.num_seq_rounds else 0.0

    @property
    def mean_branch_budget(self) -> float:
        """Branches per sequence asked for, averaged over the rounds that asked."""
        return self.branch_budget_sum / self.num_prepare_rounds if self.num_prepare_rounds else 0.0

    def hit_rate_by_kind(self) -> dict[str, float]:
        return {kind: self.hits[kind] / n for kind, n in sorted(self.outcomes.items()) if n}
