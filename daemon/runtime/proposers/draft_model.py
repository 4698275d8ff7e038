"""A separate small draft model as proposer, able to pre-draft the next round's branches.

The draft keeps its own KV cache in step with the verifier lazily: it remembers which tokens
it has cached past the last committed prefix (its own drafts, guesses) and, next time, keeps
exactly the part of them that the verifier committed — a rollback by moving a length.

`prepare` (while the verifier checks the outstanding proposal d_0..d_{m-1}) drafts branches for
likely verdicts, every sequence's branches batched in one forward per step: the all-accepted
branch in the main slot (feed d_{m-1}, take the draft's best guess g for the bonus token,
draft k after it) and, in fork rows that read the main slot's context and keep only their own
tokens, k drafts after the draft's other likely guesses — for the correction after a < m
accepted drafts (its best tokens at position a other than d_a) and for the bonus — chosen by
branch_planner.py within a budget of rows per sequence. Drafts use the same keyed randomness
as fresh drafting, so a branch holds exactly what a fresh draft of its prefix would. `adopt`
then follows the branch the verdict matched: the main slot already holds the all-accepted
branch, a fork branch is promoted into it, so the next round needs no re-feeding.
"""

import time
from typing import cast

from daemon.runtime.errors import RequestError
from daemon.runtime.model.batch import ForwardBatch, LogitsMode, group_by_length, prefill_budget
from daemon.runtime.model.forward_metadata import check_batch
from daemon.runtime.model.protocol import CausalLM, ForkingCausalLM, supports_forks
from daemon.runtime.proposers.base import Proposals, ProposeRequest, empty_proposals
from daemon.runtime.proposers.branch_planner import BranchPlanner, SequencePlan
from daemon.runtime.proposers.draft_rows import DraftRow, SlotState, run_rows
from daemon.runtime.proposers.draft_sampling import DraftSampler
from daemon.runtime.proposers.drafts import NO_BRANCH, DraftRecord, PreparedBranch, pack_records
from daemon.runtime.proposers.tail_verdicts import TailVerdicts

DEFAULT_BRANCH_WIDTH = 3  # guesses considered per position (see bench/remote_branches.py)
DEFAULT_MAX_BRANCHES = 6  # rows per sequence when preparing, the main one included (at most)
DEFAULT_MIN_BRANCH_PROB = 0.005  # a fork less likely than this is not prepared
DEFAULT_MAX_BRANCH_K = 8  # drafts per branch the branch cache is sized for


class DraftModelProposer:
    """Drafts with a causal LM sharing the target's vocabulary."""

    name = "draft_model"

    def __init__(
        self,
        model: CausalLM,
        sparse_top_k: int = 32,
        max_prefill_tokens: int | None = None,
        *,
        prefill_chunk_tokens: int | None = None,
        sparse_mass: float = 1.0,
        max_listed: int | None = None,
        tail_prior: float = 1.0,
        branch_width: int = DEFAULT_BRANCH_WIDTH,
        max_branches: int = DEFAULT_MAX_BRANCHES,
        max_branch_k: int = DEFAULT_MAX_BRANCH_K,
        min_branch_prob: float = DEFAULT_MIN_BRANCH_PROB,
        is_branching: bool = False,
    ) -> None:
        """is_branching: record, from the first proposal on, what `prepare` plans with (the
        draft's alternatives and probabilities at every position); it also turns on by itself
        at the first `prepare`. Off, in-process drafting does no work it never uses.
        max_listed: the tokens a sampled draft's list may widen to while the verifier rejects
        the sequence's tail drafts (None: sparse_top_k, no widening); tail_prior: the acceptance of
        tail drafts each sequence starts out believing (1: its lists start short).
        prefill_chunk_tokens: prompt tokens a round feeds the draft while others draft (the
        engine's chunk size; None: a prompt goes in whole at its first drafts)."""
        if prefill_chunk_tokens is not None and prefill_chunk_tokens < 1:
            raise RequestError(f"prefill_chunk_tokens must be >= 1, got {prefill_chunk_tokens}")
        self.model = model
        # padded tokens per prefill pass
        self.max_prefill_tokens = prefill_budget(max_prefill_tokens, model.device)
        self.prefill_chunk_tokens = prefill_chunk_tokens
        # Runners without fork rows (the transformers fallback) prepare the main branch only.
        self._forking = cast(ForkingCausalLM, model) if supports_forks(model) else None
        self.planner = BranchPlanner(
            max_branches=max_branches if self._forking is not None else 1,
            branch_width=branch_width,
            max_branch_k=max_branch_k,
            max_model_len=model.max_model_len,
            min_branch_prob=min_branch_prob,
        )
        self.sampler = DraftSampler(
            sparse_top_k,
            num_alternatives=branch_width + 1,
            sparse_mass=sparse_mass,
            max_listed=max_listed,
        )
        self.tail_prior = tail_prior
        self._tails: dict[int, TailVerdicts] = {}  # per sequence: how far to widen its lists
        self.tail_verdicts = TailVerdicts()  # every sequence's, for statistics only
        self._forks_ready = False  # the branch cache is allocated at the first `prepare`
        self.is_branching = is_branching
        self._states: dict[int, SlotState] = {}
        self._outstanding: dict[int, DraftRecord] = {}  # the proposal the verifier checks
        self._plans: dict[int, SequencePlan] = {}  # the last prepare's, until adopted
        self._bases: dict[int, int] = {}  # committed tokens before the outstanding drafts
        self._unfed: set[int] = set()  # admitted, prefilled at their first drafts (admit)
        self._num_fed: dict[int, int] = {}  # of those, tokens fed so far (chunked feeding)

    # -- sequences ------------------------------------------------------------------------
    def admit(self, slots: list[int], prompts: list[list[int]]) -> None:
        """Checked now (a prompt the draft model cannot take fails here), prefilled at the
        sequence's first drafts, with whatever the verifier committed by then (as the remote
        drafter's admits travel, remote_proposer.py): a sequence never asked for drafts
        (plain decoding, adaptive's choice where speculation does not pay) costs the drafter
        nothing. At 16 sequences on a target 8x the draft's cost, prefilling every prompt at
        admission cost ~5% of a plain run."""
        check_batch(
            ForwardBatch(slots, prompts, [0] * len(slots), LogitsMode.NONE),
            num_slots=self.model.num_slots,
            max_model_len=self.model.max_model_len,
            vocab_size=self.model.vocab_size,
        )
        for slot in slots:
            self._forget(slot)
            self._unfed.add(slot)

    def _feed_new(self, request: ProposeRequest) -> None:
        """Prefill the committed tokens of the admitted sequences this round first drafts for
        (with room in the draft's context to draft). With `prefill_chunk_tokens` set and other
        sequences drafting, about that many tokens a call in all, in the order of the request
        (the engine's admission order): a long prompt went in whole and every other
        sequence's round waited for it (the target's prefill is chunked for the same reason).
        A sequence still being fed drafts nothing until it is all in; the verifier decodes it
        meanwhile."""
        room = self.model.max_model_len
        new = [
            b
            for b, slot in enumerate(request.slots)
            if slot in self._unfed
            and min(request.num_to_draft[b], room - len(request.token_ids[b])) > 0
        ]
        if not new:
            return
        # others: the drafter's own (an overlapped round's message leaves out the sequences
        # whose prepared branch hit). Each being fed commits a token a round meanwhile: the
        # budget covers those, so that the backlog shrinks by the chunk every round.
        fed_slots = {request.slots[b] for b in new}
        others = any(slot not in fed_slots for slot in self._states)
        chunk = self.prefill_chunk_tokens
        left = chunk + len(new) if chunk is not None and others else None
        fresh: list[tuple[int, list[int], bool]] = []  # (slot, tokens from 0, completes)
        continued: list[tuple[int, int, list[int], bool]] = []  # (slot, start, tokens, ..)
        for b in new:
            slot, committed = request.slots[b], request.token_ids[b]
            start = self._num_fed.get(slot, 0)
            end = len(committed)
            if left is not None:
                if left <= 0:
                    break
                end = min(end, start + left)
                left -= end - start
            completes = end == len(committed)
            if start == 0:
                fresh.append((slot, committed[:end], completes))
            else:
                continued.append((slot, start, committed[start:end], completes))
        budget = self.max_prefill_tokens
        for group in group_by_length([len(f[1]) for f in fresh], budget):
            self._prefill([(fresh[i][0], 0, fresh[i][1], fresh[i][2]) for i in group])
        for slot, start, tokens, completes in continued:  # alone, as the target's (prefill.py)
            for i in range(0, len(tokens), budget):
                last = i + budget >= len(tokens)
                self._prefill([(slot, start + i, tokens[i : i + budget], completes and last)])

    def _prefill(self, pieces: list[tuple[int, int, list[int], bool]]) -> None:
        """Feed each (slot, start, tokens, completes) piece in one pass; a slot whose piece
        completes what it was admitted for is ready to draft."""
        slots = [p[0] for p in pieces]
        self.model.forward(
            ForwardBatch(slots, [p[2] for p in pieces], [p[1] for p in pieces], LogitsMode.NONE)
        )
        for slot, start, tokens, completes in pieces:
            num_fed = start + len(tokens)
            if not completes:
                self._num_fed[slot] = num_fed
                continue
            self._forget(slot)
            self._states[slot] = SlotState(num_committed=num_fed)
            self._outstanding[slot] = DraftRecord()  # no proposal yet: m = 0
            self._bases[slot] = num_fed
            self._tails[slot] = TailVerdicts(self.tail_prior)

    def release(self, slot: int) -> None:
        self._forget(slot)
        self.model.free_slot(slot)

    def _forget(self, slot: int) -> None:
        self._unfed.discard(slot)
        self._num_fed.pop(slot, None)
        self._states.pop(slot, None)
        self._outstanding.pop(slot, None)
        self._plans.pop(slot, None)
        self._bases.pop(slot, None)
        self._tails.pop(slot, None)

    # -- fresh drafts -----------------------------------------------------------------------
    def propose(self, request: ProposeRequest) -> Proposals:
        self.sampler.coupled_round = request.coupled
        start = time.perf_counter()
        self._feed_new(request)
        num_seqs = len(request.slots)
        records = [DraftRecord() for _ in range(num_seqs)]
        rows: list[DraftRow] = []
        for b, slot in enumerate(request.slots):
            self._plans.pop(slot, None)
            self._observe(slot, request.token_ids[b])
            self._outstanding[slot] = records[b]
            self._bases[slot] = len(request.token_ids[b])
            tokens = request.token_ids[b]
            k = min(request.num_to_draft[b], self.model.max_model_len - len(tokens))
            if k > 0 and slot not in self._unfed:  # unfed: its prompt goes in over rounds
                row = self._activate(request, b, [], k)
                row.record = records[b]
                rows.append(row)
        if not rows:
            return empty_proposals(num_seqs)
        run_rows(self.model, self.sampler, rows, with_alternatives=self.is_branching)
        proposals = pack_records(records)
        proposals.draft_time_s = time.perf_counter() - start
        return proposals

    def _observe(self, slot: int, committed: list[int]) -> None:
        """Learn from the verdict on the slot's outstanding drafts, now in `committed` (the
        sequence's committed tokens)."""
        record, base = self._outstanding.get(slot), self._bases.get(slot)
        if record is not None and len(record) and base is not None:
            self._observe_verdict(slot, record, committed[base:])

    def _observe_verdict(self, slot: int, record: DraftRecord, committed: list[int]) -> None:
        if self.sampler.max_listed == self.sampler.sparse_top_k:
            return  # lists never widen: nothing to learn
        tails = self._tails.get(slot)
        if tails is not None:
            tails.observe(record, committed)
        self.tail_verdicts.observe(record, committed)

    def _listing_mass(self, slot: int, with_latest: bool) -> float:
        """How much of q the slot's sampled drafts should list (tail_verdicts.py: fresh
        drafts after the latest verdict leave it out, prepared ones before it take it in)."""
        tails = self._tails.get(slot)
        return tails.listing_mass(with_latest) if tails is not None else 0.0

    def _activate(
        self, request: ProposeRequest, b: int, tail: list[int], k: int, prepared: bool = False
    ) -> DraftRow:
        """A main row that leaves the slot holding committed + `tail`: it feeds from the first
        position the cache does not already hold (at least the last token: its logits are
        needed), rolling back whatever the verifier did not commit. `prepared`: it drafts
        before the verdict on the outstanding proposal (its lists: tail_verdicts.py)."""
        slot, committed = request.slots[b], request.token_ids[b]
        state = self._states.get(slot)
        if state is None:
            raise RequestError(f"slot {slot}: not admitted to the draft model")
        base = min(state.num_committed, len(committed))
        wanted = committed[base:] + tail  # what should follow the trusted prefix
        keep = 0
        for mine, theirs in zip(state.speculative, wanted, strict=False):
            if mine != theirs:
                break
            keep += 1
        start = min(base + keep, len(committed) + len(tail) - 1)
        chunk = committed[start:] + tail[max(0, start - len(committed)) :]
        state.num_committed, state.speculative = len(committed), list(tail)
        return DraftRow(
            slot=slot,
            chunk=chunk,
            next_pos=start,
            num_to_draft=k,
            temperature=request.params[b].temperature,
            draft_seed=request.draft_seeds[b],
            listing_mass=self._listing_mass(slot, with_latest=prepared),
            state=state,
        )

    # -- branches ---------------------------------------------------------------------------
    def prepare(
        self, request: ProposeRequest, max_branches: int | None = None
    ) -> list[list[PreparedBranch]]:
        """Pre-draft the likely verdicts of each slot's outstanding proposal (module doc),
        at most `max_branches` per sequence (default and ceiling: the proposer's own)."""
        self.is_branching = True
        self.sampler.coupled_round = request.coupled
        budget = min(max_branches or self.planner.max_branches, self.planner.max_branches)
        self._ensure_forks()
        self._feed_new(request)
        plans: dict[int, SequencePlan] = {}
        rows: list[DraftRow] = []
        for b, slot in enumerate(request.slots):
            self._plans.pop(slot, None)
            record = self._outstanding.get(slot)
            k = min(request.num_to_draft[b], self.planner.max_branch_k)
            if k <= 0 or record is None or slot not in self._states:
                continue
            plan = self._plan(request, b, record, k, max(0, budget - 1))
            plans[slot] = plan
            rows.extend([plan.main] if plan.main is not None else [])
            rows.extend(f.row for f in plan.forks)

        def on_guess(main: DraftRow, guesses: list[int], probs: list[float]) -> list[DraftRow]:
            return self.planner.on_guess(plans[main.slot], guesses, probs)

        num_guesses = self.planner.branch_width if budget > 1 else 1
        run_rows(self.model, self.sampler, rows, num_guesses, on_guess)
        self._plans.update(plans)
        return [
            [br.branch for br in plans[slot].branches()] if slot in plans else []
            for slot in request.slots
        ]

    def _plan(
        self, request: ProposeRequest, b: int, record: DraftRecord, k: int, num_forks: int
    ) -> SequencePlan:
        """The guessing main row (all accepted) and the correction forks of one sequence."""
        num_committed = len(request.token_ids[b])
        plan = SequencePlan(
            slot=request.slots[b],
            record=record,
            num_committed=num_committed,
            k=k,
            temperature=request.params[b].temperature,
            draft_seed=request.draft_seeds[b],
            listing_mass=self._listing_mass(request.slots[b], with_latest=True),
            num_forks=num_forks,
        )
        room = self.model.max_model_len - (num_committed + len(record))
        if min(k, room) > 0:
            plan.main = self._activate(request, b, record.tokens, min(k, room), prepared=True)
            plan.main.is_guessing = True
        self.planner.plan_corrections(plan)
        return plan

    def _ensure_forks(self) -> None:
        if self._forking is not None and not self._forks_ready and self.planner.forks_per_slot:
            num_branch_slots = self.model.num_slots * self.planner.forks_per_slot
            self._forking.enable_forks(num_branch_slots, self.planner.max_branch_k)
            self._forks_ready = True

    def adopt(self, slot: int, branch: int, num_used: int, committed: list[int]) -> None:
        """The verifier committed `committed` since the last update; its verdict matched
        prepared branch number `branch`, whose first `num_used` drafts it now checks
        (NO_BRANCH: none did; it checks a fresh proposal, or none)."""
        plan = self._plans.pop(slot, None)
        record = self._outstanding.pop(slot, None)
        if record is not None:
            self.planner.observe(record, plan.bonus_guesses if plan else [], committed)
            self._observe_verdict(slot, record, committed)
        base = self._bases.pop(slot, None)
        if base is not None:  # the next drafts follow what the verifier just committed
            self._bases[slot] = base + len(committed)
        if branch == NO_BRANCH:
            # the verifier drafts afresh (a propose follows) or goes without drafts: m = 0
            self._outstanding[slot] = DraftRecord()
            return
        branches = plan.branches() if plan is not None else []
        if not 0 <= branch < len(branches):
            raise RequestError(f"slot {slot}: no prepared branch {branch}")
        chosen = branches[branch]
        row = chosen.row
        if row.is_fork and self._forking is not None:
            self._forking.promote(row.slot, slot, row.fork_position, len(row.fed))
            self._states[slot] = SlotState(row.fork_position, list(row.fed))
        self._outstanding[slot] = chosen.branch.drafts.truncated(num_used)
