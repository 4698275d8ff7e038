"""The verifier side of remote speculation: a `Proposer` over a `DraftTransport`.

The engine cannot tell it from a local proposer. Per slot it tracks what the drafter already
holds, so only deltas cross the wire (the tokens committed since, k), the proposal the engine
is verifying, and the branches the drafter prepared for its verdicts.

Sync mode: one call per round (updates + propose), then the engine verifies.

Overlapped mode: right after obtaining a round's proposals, before returning them to the
engine, it sends a prepare request without waiting, so the drafter pre-drafts the next round
while the engine verifies; the prepared branches come back by themselves. On the next
`propose` it reads each sequence's verdict from the committed tokens, takes the matching
branch (waiting only if the branches are not there yet) and makes one fresh call for the
misses (carrying every update). A hit costs no round trip.

Without a drafter (DrafterUnavailable, a drafter with a new instance id, an untrustworthy
reply) it returns no drafts, so the engine keeps decoding with k = 0, and probes now and then
(drafter_link.py); when a drafter answers it re-admits every running sequence with its full
token list — a resync, the only time O(context) bytes cross the wire after admission — and
speculation resumes.
"""

import logging
import time
from dataclasses import dataclass

from daemon.runtime.proposers.base import Proposals, ProposeRequest, empty_proposals
from daemon.runtime.proposers.drafts import DraftRecord, PreparedBranch, pack_records
from daemon.runtime.remote.branch_budget import BranchBudget
from daemon.runtime.remote.drafter_link import DrafterLink
from daemon.runtime.remote.messages import (
    AdmitEntry,
    DraftEntry,
    DraftReply,
    DraftRequest,
    UpdateEntry,
)
from daemon.runtime.remote.miss_policy import MissCosts, MissPolicy
from daemon.runtime.remote.options import RemoteOptions
from daemon.runtime.remote.remote_stats import RemoteRoundStats, RemoteStats
from daemon.runtime.remote.transport import DrafterUnavailable, DraftTransport, PendingCall
from daemon.runtime.remote.verdict import find_branch, read_verdict

logger = logging.getLogger(__name__)
MAX_WIRE_K = 255


@dataclass(slots=True)
class _Slot:
    is_on_drafter: bool = False  # admitted there (else the next round with k > 0 admits it)
    num_known: int = 0  # committed tokens the drafter holds
    drafts: list[int] | None = None  # the proposal the engine is verifying
    num_before: int = 0  # committed tokens when it was proposed
    branches: list[PreparedBranch] | None = None  # prepared for its verdicts, once arrived


@dataclass(slots=True)
class _PendingPrepare:
    call: PendingCall
    message_id: int
    slots: dict[int, _Slot]  # the tracked slots it prepares for (a slot reused since is not)
    sent_at: float  # perf_counter


class RemoteProposer:
    name = "remote"

    def __init__(self, transport: DraftTransport, options: RemoteOptions | None = None) -> None:
        self.options = options or RemoteOptions()
        self.link = DrafterLink(transport, self.options)
        self.stats = RemoteStats()
        self._slots: dict[int, _Slot] = {}
        self._releases: list[int] = []  # sent with the next request
        self._pending: _PendingPrepare | None = None
        self._needs_resync = False
        self.costs = MissCosts()
        self._returned_at: float | None = None  # when the last proposals went to the engine
        self.budget = BranchBudget(
            maximum=self.options.max_branches,
            value=self.options.initial_branches,
            is_adaptive=self.options.is_adaptive_branches,
        )

    # -- Proposer ---------------------------------------------------------------------------
    def admit(self, slots: list[int], prompts: list[list[int]]) -> None:
        """Remembered only: the admit (with the request's seed and temperature, which arrive
        with the first round) travels with the next request that drafts for the slot."""
        for slot in slots:
            self.release(slot)
            self._slots[slot] = _Slot()

    def release(self, slot: int) -> None:
        tracked = self._slots.pop(slot, None)
        if tracked is not None and tracked.is_on_drafter:
            self._releases.append(slot)

    def propose(self, request: ProposeRequest) -> Proposals:
        start = time.perf_counter()
        if self._returned_at is not None:
            self.costs.gap_s.add(start - self._returned_at)
        stats = RemoteRoundStats()
        proposals = empty_proposals(len(request.slots))
        try:
            if self.link.is_available or self._found_drafter(stats):
                proposals = self._round(request, stats)
            else:
                stats.is_without_drafter = True
        except DrafterUnavailable as exc:
            self._lose(str(exc))
            stats.is_without_drafter = True
            proposals = empty_proposals(len(request.slots))
        stats.propose_time_s = time.perf_counter() - start
        stats.num_draft_tokens = sum(proposals.num_draft_tokens)
        proposals.draft_time_s = stats.propose_time_s  # what drafting cost this engine
        self.stats.add(stats)
        self._returned_at = time.perf_counter()
        return proposals

    def flush(self) -> None:
        """Wait for the request in flight and hand the drafter every queued release (for the
        end of a run: releases otherwise travel with the next request). Waits are bounded by
        the options' timeouts; a drafter that does not answer is marked lost."""
        if not self.link.is_available:
            return
        stats = RemoteRoundStats()
        try:
            self._collect_prepared(stats)
            if self._releases:
                message = self.link.new_request()
                message.releases, self._releases = self._releases, []
                reply = self.link.call(message, self.options.call_timeout_s, stats)
                self._take_errors(reply, stats)
        except DrafterUnavailable as exc:
            self._lose(str(exc))

    # -- one round --------------------------------------------------------------------------
    def _round(self, request: ProposeRequest, stats: RemoteRoundStats) -> Proposals:
        self._collect_prepared(stats)
        records = [DraftRecord() for _ in request.slots]
        message = self.link.new_request(request.coupled)
        message.is_reset = self._needs_resync
        message.releases, self._releases = ([], []) if self._needs_resync else (self._releases, [])
        fresh = []
        for b in range(len(request.slots)):
            entry = self._plan(request, b, message, records, stats)
            if entry is not None:
                fresh.append(entry)
        self._needs_resync = False
        policy = self.options.miss_policy if self.options.is_overlapped else MissPolicy.FRESH
        if self.costs.drafts_afresh(policy, stats.num_hits, len(fresh)):
            message.propose = fresh
            waited = stats.wait_s
            reply = self.link.call(message, self.options.call_timeout_s, stats)
            self.costs.fresh_wait_s.add(stats.wait_s - waited)
            self._take_errors(reply, stats)
            row_of = {slot: b for b, slot in enumerate(request.slots)}
            for entry in reply.proposals:
                b = row_of.get(entry.slot)
                if b is not None:
                    records[b] = entry.drafts.truncated(request.num_to_draft[b])
            stats.num_fresh = len(fresh)
            message = self.link.new_request(request.coupled)
        else:  # skipped: no drafts this round; their updates go with the prepare request
            stats.num_skipped = len(fresh)
        if self.options.is_overlapped:
            self._send_prepare(message, request, stats)
        elif message.admits or message.updates or message.is_reset:
            self._take_errors(self.link.call(message, self.options.call_timeout_s, stats), stats)
        else:  # sync, releases only: they go with the next request
            self._releases = message.releases + self._releases
        for b, slot in enumerate(request.slots):
            tracked = self._slots[slot]
            tracked.drafts, tracked.num_before = records[b].tokens, len(request.token_ids[b])
            tracked.branches = None
        return pack_records(records)

    def _plan(
        self,
        request: ProposeRequest,
        b: int,
        message: DraftRequest,
        records: list[DraftRecord],
        stats: RemoteRoundStats,
    ) -> DraftEntry | None:
        """Add row b's part to `message`; return its fresh-draft entry if it needs one."""
        slot, tokens = request.slots[b], request.token_ids[b]
        k = min(request.num_to_draft[b], MAX_WIRE_K)
        tracked = self._slots.setdefault(slot, _Slot())
        if self._needs_resync:
            tracked.is_on_drafter = False
        stats.num_seqs += int(k > 0)
        if not tracked.is_on_drafter:
            if k <= 0 and not self._needs_resync:
                return None  # admitted when it first drafts
            seed, temperature = request.draft_seeds[b], request.params[b].temperature
            message.admits.append(AdmitEntry(slot, list(tokens), seed, temperature))
            tracked.is_on_drafter, tracked.num_known = True, len(tokens)
            return DraftEntry(slot, k) if k > 0 else None
        if k <= 0:
            return None  # its update waits for a round that drafts
        if tracked.drafts:
            verdict = read_verdict(tracked.drafts, tracked.num_before, tokens)
            if verdict is not None:
                self.costs.tokens_per_round.add(verdict.num_accepted + 1)
        hit = self._match(tracked, tokens, stats)
        new_tokens, tracked.num_known = tokens[tracked.num_known :], len(tokens)
        if hit is None:
            message.updates.append(UpdateEntry(slot, new_tokens))
            return DraftEntry(slot, k)
        index, drafts = hit
        records[b] = drafts.truncated(k)
        stats.num_hidden_drafts += len(records[b])
        message.updates.append(UpdateEntry(slot, new_tokens, index, len(records[b])))
        return None

    def _match(
        self, tracked: _Slot, tokens: list[int], stats: RemoteRoundStats
    ) -> tuple[int, DraftRecord] | None:
        """The prepared branch matching this sequence's verdict, if any (index, drafts)."""
        if tracked.branches is None or tracked.drafts is None:
            return None
        stats.num_with_branches += 1
        verdict = read_verdict(tracked.drafts, tracked.num_before, tokens)
        if verdict is None:
            stats.outcomes["other"] += 1
            return None
        stats.outcomes[verdict.kind] += 1
        found = find_branch(tracked.branches, verdict)
        if found is None:
            return None
        index, rank = found
        stats.num_hits += 1
        stats.hits[verdict.kind] += 1
        stats.hits_by_rank[rank] += 1
        return index, tracked.branches[index].drafts

    # -- overlap ----------------------------------------------------------------------------
    def _send_prepare(
        self, message: DraftRequest, request: ProposeRequest, stats: RemoteRoundStats
    ) -> None:
        """Ask for the next round's branches now; the reply is collected next round."""
        slots: dict[int, _Slot] = {}
        for b, slot in enumerate(request.slots):
            k = request.num_to_draft[b]
            tracked = self._slots[slot]
            if k > 0 and tracked.is_on_drafter:
                k = min(self.options.prepare_k or k, MAX_WIRE_K)
                message.prepare.append(DraftEntry(slot, k))
                slots[slot] = tracked
        if message.is_probe:
            return
        message.max_branches = self.budget.value
        stats.branch_budget = self.budget.value
        call = self.link.send(message, stats)
        self._pending = _PendingPrepare(call, message.message_id, slots, time.perf_counter())

    def _collect_prepared(self, stats: RemoteRoundStats) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        start = time.perf_counter()
        try:
            data = pending.call.result(self.options.prepare_timeout_s)
        finally:
            waited = time.perf_counter() - start
            stats.wait_s += waited
            stats.prepare_wait_s += waited
        reply = self.link.accept(pending.message_id, data, stats)
        self.budget.update(start - pending.sent_at, waited, reply.prepare_time_s)
        self._take_errors(reply, stats)
        for entry in reply.branches:
            tracked = pending.slots.get(entry.slot)
            if tracked is not None and self._slots.get(entry.slot) is tracked:
                tracked.branches = entry.branches

    # -- faults -----------------------------------------------------------------------------
    def _take_errors(self, reply: DraftReply, stats: RemoteRoundStats) -> None:
        """An error about a slot: re-admit it (full token list) next time it drafts."""
        for error in reply.errors:
            tracked = self._slots.get(error.slot)
            logger.warning("drafter error for slot %d: %s", error.slot, error.message)
            if tracked is not None:
                tracked.is_on_drafter, tracked.branches = False, None
                stats.num_slot_resyncs += 1

    def _found_drafter(self, stats: RemoteRoundStats) -> bool:
        if not self.link.poll(stats):
            return False
        self._needs_resync = stats.is_resync = True
        return True

    def _lose(self, reason: str) -> None:
        self.link.lose(reason)
        self.stats.num_drafter_losses += 1
        self._pending = None
        self._releases.clear()
        self._needs_resync = True
        for tracked in self._slots.values():
            tracked.drafts, tracked.branches = None, None
