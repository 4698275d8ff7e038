"""Drafts as a proposer keeps them, and the pre-drafted branches for the next round.

A `DraftRecord` is one sequence's drafts, position by position: the token, the exact sparse
counts it was drawn from (sampled drafts; see sampling/quantized.py) and the proposer's best
tokens at that position, which are its guesses for the verifier's correction there.

While the verifier checks a proposal of m drafts d_0..d_{m-1} after n committed tokens, a
branching proposer pre-drafts the next round for likely verdicts. A verdict is (a, t): a drafts
accepted, then token t at position n + a (the correction when a < m, the bonus when a == m).
Branch (a, t) holds the drafts that would follow the committed prefix + d_0..d_{a-1} + t.
"""

from dataclasses import dataclass, field
from typing import Protocol

import torch

from daemon.runtime.model import native
from daemon.runtime.proposers.base import (
    PLACEHOLDER_TOKEN_ID,
    Proposals,
    Proposer,
    ProposeRequest,
)
from daemon.runtime.sampling.quantized import PROPOSAL_TOTAL, counts_to_probs

NO_BRANCH = -1  # `adopt`: the verdict matched no prepared branch


@dataclass(slots=True)
class SparseDraw:
    """The distribution one sampled draft was drawn from, in counts out of PROPOSAL_TOTAL:
    `counts[i]` on token `ids[i]`, and `tail` on the tokens not listed with a positive count
    (see sampling/quantized.py)."""

    ids: torch.Tensor  # [S] int64; entries with count 0 are padding
    counts: torch.Tensor  # [S] int64; with `tail`, summing to PROPOSAL_TOTAL
    tail: int = 0
    # the drafter's own note (not on the wire): its draft came from the tail, not the list
    from_tail: bool = False


@dataclass(slots=True)
class DraftRecord:
    """Drafts position by position. `alternatives` and the probabilities are the proposer's
    own notes for planning branches (they do not cross the wire)."""

    tokens: list[int] = field(default_factory=list)
    sparse: list[SparseDraw | None] = field(default_factory=list)  # None: a point mass
    alternatives: list[list[int]] = field(default_factory=list)  # best tokens, best first
    token_probs: list[float] = field(default_factory=list)  # the draft's prob of its token
    alternative_probs: list[list[float]] = field(default_factory=list)

    def append(
        self,
        token: int,
        sparse: SparseDraw | None,
        alternatives: list[int],
        token_prob: float = 1.0,
        alternative_probs: list[float] | None = None,
    ) -> None:
        self.tokens.append(token)
        self.sparse.append(sparse)
        self.alternatives.append(alternatives)
        self.token_probs.append(token_prob)
        self.alternative_probs.append(alternative_probs or [0.0] * len(alternatives))

    def truncated(self, num: int) -> "DraftRecord":
        return DraftRecord(
            self.tokens[:num],
            self.sparse[:num],
            self.alternatives[:num],
            self.token_probs[:num],
            self.alternative_probs[:num],
        )

    def prefix_prob(self, num: int) -> float:
        """The draft's own estimate that its first `num` drafts are all accepted."""
        prob = 1.0
        for p in self.token_probs[:num]:
            prob *= p
        return prob

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(slots=True)
class PreparedBranch:
    num_accepted: int  # a: drafts of the outstanding proposal this branch assumes accepted
    token: int  # t: the correction (a < m) or bonus (a == m) token it assumes next
    drafts: DraftRecord  # what the proposer drafts after them

    @property
    def key(self) -> tuple[int, int]:
        return self.num_accepted, self.token


class BranchingProposer(Proposer, Protocol):
    """A proposer that can pre-draft the next round while the verifier checks this one.

    `prepare` takes the same request as `propose` (committed tokens, drafts wanted per branch)
    and works from the outstanding proposal: the last one `propose` returned for each slot, or
    the branch `adopt` made current. `adopt` is told what the verifier committed since the
    last update (the verdict, which a proposer may learn from) and moves the slot onto the
    branch that verdict matched (NO_BRANCH: none did, so the next round drafts afresh), whose
    first `num_used` drafts the verifier now proposes.
    """

    def prepare(
        self, request: ProposeRequest, max_branches: int | None = None
    ) -> list[list[PreparedBranch]]:
        """Per request row, the branches prepared (empty where k is 0 or nothing fits), at
        most `max_branches` per sequence (None: the proposer's own budget)."""
        ...

    def adopt(self, slot: int, branch: int, num_used: int, committed: list[int]) -> None:
        """Follow branch number `branch` of the slot's last `prepare`, or NO_BRANCH."""
        ...


def correction_guesses(record: DraftRecord, position: int, width: int) -> list[tuple[int, float]]:
    """Up to `width` guesses for the correction at draft `position`, with the draft's
    probability of each: its best tokens there other than the draft itself (which the
    verifier has just rejected)."""
    rejected = record.tokens[position]
    pairs = zip(record.alternatives[position], record.alternative_probs[position], strict=True)
    return [(t, p) for t, p in pairs if t != rejected][:width]


def pack_records(records: list[DraftRecord]) -> Proposals:
    """Per-row records -> the Proposals tensors (sparse q = count / N, exact in float32)."""
    num_rows = len(records)
    max_k = max((len(r) for r in records), default=0)
    padded = [r.tokens + [PLACEHOLDER_TOKEN_ID] * (max_k - len(r)) for r in records]
    drafts = torch.tensor(padded, dtype=torch.long).reshape(num_rows, max_k)  # [B, K]
    # every sampled draft's (row, position, draw): written with one indexed store per tensor
    # (a store per draft costs ~10 us of torch overhead each, 64 of them at B = 16, k = 4)
    draws = [
        (row, pos, sparse)
        for row, record in enumerate(records)
        for pos, sparse in enumerate(record.sparse)
        if sparse is not None
    ]
    sparse_ids = sparse_probs = sparse_tail = None
    packed = _native_pack(draws, num_rows, max_k) if draws else None
    if packed is not None:
        sparse_ids, sparse_probs, sparse_tail = packed
    elif draws:
        rows = torch.tensor([row for row, _, _ in draws])  # [E]
        positions = torch.tensor([pos for _, pos, _ in draws])  # [E]
        # [E, S] padded with id 0 and count 0 (probability 0: padding)
        ids = _padded_rows([d.ids for _, _, d in draws])
        counts = _padded_rows([d.counts for _, _, d in draws])
        width = ids.shape[-1]
        sparse_ids = torch.zeros((num_rows, max_k, width), dtype=torch.long)  # [B, K, S]
        sparse_probs = torch.zeros((num_rows, max_k, width))  # [B, K, S]
        sparse_tail = torch.zeros((num_rows, max_k))  # [B, K]
        sparse_ids[rows, positions] = ids
        sparse_probs[rows, positions] = counts_to_probs(counts)
        tails = torch.tensor([d.tail for _, _, d in draws], dtype=torch.float32)  # [E]
        sparse_tail[rows, positions] = tails / PROPOSAL_TOTAL  # exact in float32
    return Proposals(
        draft_token_ids=drafts,
        num_draft_tokens=[len(r) for r in records],
        sparse_ids=sparse_ids,
        sparse_probs=sparse_probs,
        sparse_tail=sparse_tail,
    )


def _padded_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """1-D tensors -> [E, S] padded with 0 past each row's length (S the longest): what
    pad_sequence gives, by stacking the rows of each length (a draft step's rows share one:
    a few stacks, where pad_sequence copies row by row, ~1 us a row in four ops each)."""
    width = max(row.shape[0] for row in rows)
    by_length: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        by_length.setdefault(row.shape[0], []).append(i)
    if len(by_length) == 1:
        return torch.stack(rows)
    out = rows[0].new_zeros(len(rows), width)
    for length, members in by_length.items():
        out[members, :length] = torch.stack([rows[i] for i in members])
    return out


def _native_pack(
    draws: list[tuple[int, int, SparseDraw]], num_rows: int, max_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """pack_records' sparse tensors [B, K, S] ids, probs and [B, K] tail in one C call (the
    torch path: ~20 ops, with an indexed store per length of draws), where the kernels run
    and every draw holds int64 ids and counts in CPU memory; else None."""
    module = native.kernels() if native.enabled() else None
    if module is None:
        return None
    for _, _, d in draws:
        for t in (d.ids, d.counts):
            if t.dtype != torch.int64 or t.device.type != "cpu" or t.dim() != 1:
                return None
            if t.stride(0) != 1 and t.shape[0] > 1:
                return None
    width = max(d.ids.shape[0] for _, _, d in draws)
    if any(d.counts.shape[0] != d.ids.shape[0] for _, _, d in draws):
        return None  # the torch path says what is wrong
    ids = torch.empty((num_rows, max_k, width), dtype=torch.long)
    probs = torch.empty((num_rows, max_k, width))
    tail = torch.empty((num_rows, max_k))
    module.pack_draws(
        [row for row, _, _ in draws], [pos for _, pos, _ in draws],
        [d.ids.data_ptr() for _, _, d in draws], [d.counts.data_ptr() for _, _, d in draws],
        [d.ids.shape[0] for _, _, d in draws], [d.tail for _, _, d in draws],
        num_rows, max_k, width, PROPOSAL_TOTAL, ids.data_ptr(), probs.data_ptr(),
        tail.data_ptr(),
    )  # fmt: skip
    return ids, probs, tail
