"""The drafter side: one entry point, `DraftServer.handle(payload) -> payload`.

A transport (a thread in this process, a Ray actor on another node) hands it each request's
bytes in the order sent and carries the reply back. The server owns a proposer (draft model or
n-gram) and the drafter's copy of every sequence's committed tokens; it applies the request's
parts in order (reset, releases, admits, updates, propose, prepare) and replies with fresh
proposals, prepared branches, its instance id and any errors.

Nothing a request says can crash it: a malformed message gets an error reply for the whole
message, an unknown slot gets an error for that slot (the other slots are served), and a
re-admitted slot is resynchronised from the token list it carries.
"""

import logging
import random
import time
from dataclasses import dataclass

import torch

from daemon.runtime.errors import SpecError
from daemon.runtime.proposers.base import Proposer, ProposeRequest
from daemon.runtime.proposers.drafts import DraftRecord, SparseDraw
from daemon.runtime.remote.messages import (
    WHOLE_MESSAGE,
    AdmitEntry,
    DraftEntry,
    DraftReply,
    DraftRequest,
    SlotBranches,
    SlotDrafts,
    SlotError,
    UpdateEntry,
)
from daemon.runtime.remote.wire import decode_request, encode_reply
from daemon.runtime.remote.wire_io import WireError
from daemon.runtime.sampling.params import SamplingParams
from daemon.runtime.sampling.quantized import PROPOSAL_TOTAL

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Sequence:
    token_ids: list[int]  # committed tokens, as far as the verifier has told
    params: SamplingParams
    draft_seed: int


@dataclass(slots=True)
class ServerStats:
    num_requests: int = 0
    num_errors: int = 0
    propose_time_s: float = 0.0
    prepare_time_s: float = 0.0
    num_branches: int = 0


class DraftServer:
    """Serves one verifier's draft requests with `proposer` (NgramProposer or
    DraftModelProposer; any `Proposer`, and `prepare` needs a `BranchingProposer`)."""

    def __init__(self, proposer: Proposer, *, instance_id: int | None = None) -> None:
        self.proposer = proposer
        self.instance_id = (
            instance_id if instance_id is not None else random.SystemRandom().getrandbits(63)
        )
        self.stats = ServerStats()
        self._seqs: dict[int, _Sequence] = {}

    def handle(self, payload: bytes) -> bytes:
        """One request's bytes -> its reply's bytes. Never raises for anything in `payload`."""
        self.stats.num_requests += 1
        try:
            request = decode_request(payload)
        except WireError as exc:
            self.stats.num_errors += 1
            error = SlotError(WHOLE_MESSAGE, str(exc))
            return encode_reply(DraftReply(0, self.instance_id, [error]))
        reply = DraftReply(request.message_id, self.instance_id)
        try:
            self._apply(request, reply)
        except Exception as exc:  # the proposer failed: report it, keep serving
            logger.exception("draft server: request %d failed", request.message_id)
            reply.errors.append(SlotError(WHOLE_MESSAGE, f"drafter error: {exc}"))
        self.stats.num_errors += len(reply.errors)
        return encode_reply(reply)

    @property
    def slots(self) -> list[int]:
        return sorted(self._seqs)

    def token_ids(self, slot: int) -> list[int]:
        """The committed tokens the server holds for `slot` (for tests and diagnostics)."""
        return list(self._seqs[slot].token_ids)

    # -- applying a request -----------------------------------------------------------------
    def _apply(self, request: DraftRequest, reply: DraftReply) -> None:
        if request.is_reset:
            for slot in list(self._seqs):
                self._release(slot)
        for slot in request.releases:
            self._release(slot)
        self._admit(request.admits, reply)
        for update in request.updates:
            self._update(update, reply)
        bad = {e.slot for e in reply.errors}
        proposals = self._known(request.propose, reply, bad, "propose")
        if proposals:
            reply.proposals, reply.draft_time_s = self._propose(proposals, request.coupled)
        prepares = self._known(request.prepare, reply, bad, "prepare")
        if prepares:
            budget = request.max_branches or None
            reply.branches, reply.prepare_time_s = self._prepare(prepares, budget, request.coupled)

    def _release(self, slot: int) -> None:
        if self._seqs.pop(slot, None) is not None:
            self.proposer.release(slot)

    def _admit(self, admits: list[AdmitEntry], reply: DraftReply) -> None:
        good = []
        for admit in admits:
            if not admit.token_ids:
                reply.errors.append(SlotError(admit.slot, "admit with no tokens"))
                continue
            self._release(admit.slot)  # a re-admit resynchronises the slot
            params = SamplingParams(temperature=admit.temperature)
            self._seqs[admit.slot] = _Sequence(list(admit.token_ids), params, admit.draft_seed)
            good.append(admit)
        if good:
            try:
                self.proposer.admit([a.slot for a in good], [a.token_ids for a in good])
            except SpecError as exc:
                for admit in good:
                    self._seqs.pop(admit.slot, None)
                    reply.errors.append(SlotError(admit.slot, f"admit failed: {exc}"))

    def _update(self, update: UpdateEntry, reply: DraftReply) -> None:
        seq = self._seqs.get(update.slot)
        if seq is None:
            reply.errors.append(SlotError(update.slot, "update for a slot never admitted"))
            return
        seq.token_ids.extend(update.new_token_ids)
        adopt = getattr(self.proposer, "adopt", None)
        if adopt is None:
            return
        try:
            adopt(update.slot, update.branch, update.num_used, update.new_token_ids)
        except SpecError as exc:
            reply.errors.append(SlotError(update.slot, str(exc)))

    def _known(
        self, entries: list[DraftEntry], reply: DraftReply, bad: set[int], what: str
    ) -> list[DraftEntry]:
        known = []
        for entry in entries:
            if entry.slot in bad:
                continue
            if entry.slot not in self._seqs:
                reply.errors.append(SlotError(entry.slot, f"{what} for a slot never admitted"))
                continue
            known.append(entry)
        return known

    def _request(self, entries: list[DraftEntry], coupled: bool) -> ProposeRequest:
        seqs = [self._seqs[e.slot] for e in entries]
        return ProposeRequest(
            slots=[e.slot for e in entries],
            token_ids=[s.token_ids for s in seqs],
            num_to_draft=[e.k for e in entries],
            params=[s.params for s in seqs],
            draft_seeds=[s.draft_seed for s in seqs],
            coupled=coupled,
        )

    def _propose(self, entries: list[DraftEntry], coupled: bool) -> tuple[list[SlotDrafts], float]:
        start = time.perf_counter()
        proposals = self.proposer.propose(self._request(entries, coupled))
        records = _records(proposals.draft_token_ids.tolist(), proposals.num_draft_tokens)
        if proposals.sparse_ids is not None and proposals.sparse_probs is not None:
            tail = proposals.sparse_tail
            if tail is None:
                tail = torch.zeros(proposals.sparse_probs.shape[:2])
            _attach_sparse(records, proposals.sparse_ids, proposals.sparse_probs, tail)
        elapsed = time.perf_counter() - start
        self.stats.propose_time_s += elapsed
        return [SlotDrafts(e.slot, r) for e, r in zip(entries, records, strict=True)], elapsed

    def _prepare(
        self, entries: list[DraftEntry], max_branches: int | None, coupled: bool
    ) -> tuple[list[SlotBranches], float]:
        prepare = getattr(self.proposer, "prepare", None)
        if prepare is None:
            return [], 0.0
        start = time.perf_counter()
        branches = prepare(self._request(entries, coupled), max_branches)
        elapsed = time.perf_counter() - start
        self.stats.prepare_time_s += elapsed
        self.stats.num_branches += sum(len(b) for b in branches)
        return [SlotBranches(e.slot, b) for e, b in zip(entries, branches, strict=True)], elapsed


def _records(drafts: list[list[int]], num_drafts: list[int]) -> list[DraftRecord]:
    return [
        DraftRecord(row[:n], [None] * n, [[] for _ in range(n)])
        for row, n in zip(drafts, num_drafts, strict=True)
    ]


def _attach_sparse(
    records: list[DraftRecord],
    sparse_ids: torch.Tensor,  # [B, K, S] int64
    sparse_probs: torch.Tensor,  # [B, K, S] float32, multiples of 1 / PROPOSAL_TOTAL
    sparse_tail: torch.Tensor,  # [B, K] float32, multiples of 1 / PROPOSAL_TOTAL
) -> None:
    """Proposals' sparse q -> the integer counts they were drawn from. Only a proposal
    quantised to counts of 2^15 can cross the wire unchanged; anything else is refused."""
    scaled = torch.cat([sparse_probs, sparse_tail.unsqueeze(-1)], -1).double() * PROPOSAL_TOTAL
    counts = scaled.round()  # [B, K, S + 1]
    if not torch.equal(counts, scaled):
        raise SpecError("the proposer's sparse proposal is not quantised to counts of 2^15")
    counts_long = counts.long()
    for row, record in enumerate(records):
        for pos in range(len(record.tokens)):
            if bool((counts_long[row, pos] > 0).any()):
                listed, tail = counts_long[row, pos, :-1], int(counts_long[row, pos, -1])
                record.sparse[pos] = SparseDraw(sparse_ids[row, pos], listed, tail)
