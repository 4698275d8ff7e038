"""Prompt lookup / n-gram proposer: no model, no memory.

If the last n tokens of a sequence occurred earlier in it, propose the tokens that followed
that earlier occurrence (the most recent one). Longer n-grams are tried first.

Branches for the next round are lookups on the hypothetical token lists (cheap): for each
accepted count a, the guesses for the token after committed + d_0..d_{a-1} are the distinct
tokens that followed earlier occurrences of its suffix (other than d_a, which the verdict
rejected), and each branch drafts by lookup after its guess.
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from daemon.runtime.errors import RequestError
from daemon.runtime.proposers.base import Proposals, ProposeRequest, pack_draft_ids
from daemon.runtime.proposers.drafts import NO_BRANCH, DraftRecord, PreparedBranch

DEFAULT_BRANCH_WIDTH = 2


@dataclass(slots=True)
class NgramProposer:
    max_ngram: int = 4
    min_ngram: int = 1
    max_lookback: int = 4096  # tokens searched backwards; bounds the per-round cost
    branch_width: int = DEFAULT_BRANCH_WIDTH  # guesses per position when preparing
    name: str = "ngram"
    _outstanding: dict[int, list[int]] = field(default_factory=dict, repr=False)
    _prepared: dict[int, list[PreparedBranch]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(
                f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}"
            )
        if self.branch_width < 1:
            raise ValueError(f"branch_width must be >= 1, got {self.branch_width}")

    def admit(self, slots: list[int], prompts: list[list[int]]) -> None:
        for slot in slots:
            self.release(slot)
            self._outstanding[slot] = []  # no proposal yet

    def release(self, slot: int) -> None:
        self._outstanding.pop(slot, None)
        self._prepared.pop(slot, None)

    def propose(self, request: ProposeRequest) -> Proposals:
        start = time.perf_counter()
        drafts = [
            self.lookup(tokens, k) if k > 0 else []
            for tokens, k in zip(request.token_ids, request.num_to_draft, strict=True)
        ]
        for slot, draft in zip(request.slots, drafts, strict=True):
            self._outstanding[slot] = draft
            self._prepared.pop(slot, None)
        return Proposals(
            draft_token_ids=pack_draft_ids(drafts),
            num_draft_tokens=[len(d) for d in drafts],
            draft_time_s=time.perf_counter() - start,
        )

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest suffix."""
        return self._lookup(self._window(tokens), k)

    def candidates(self, tokens: list[int], width: int) -> list[int]:
        """Up to `width` distinct tokens that followed earlier occurrences of the sequence's
        suffix: longest n-gram first, then the most recent occurrence first."""
        return self._candidates(self._window(tokens), width)

    def _window(self, tokens: list[int]) -> np.ndarray:
        return np.asarray(tokens[-self.max_lookback :], dtype=np.int64)  # [L]

    def _matches(self, window: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """(n, positions after each earlier occurrence of the last n tokens), longest n first;
        positions are in increasing order (the most recent occurrence last)."""
        num_tokens = int(window.shape[0])
        for n in range(min(self.max_ngram, num_tokens - 1), self.min_ngram - 1, -1):
            # [L - n, n]: every earlier n-gram that has at least one token after it
            grams = sliding_window_view(window[:-1], n)
            hits = np.flatnonzero((grams == window[num_tokens - n :]).all(axis=1))
            if hits.size:
                yield n, hits + n

    def _lookup(self, window: np.ndarray, k: int) -> list[int]:
        for _, after in self._matches(window):
            begin = int(after[-1])  # the most recent occurrence
            return window[begin : begin + k].tolist()
        return []

    def _candidates(self, window: np.ndarray, width: int) -> list[int]:
        found: list[int] = []
        for _, after in self._matches(window):
            for token in window[after[::-1]].tolist():
                if token not in found:
                    found.append(token)
                    if len(found) == width:
                        return found
        return found

    # -- branches ---------------------------------------------------------------------------
    def prepare(
        self, request: ProposeRequest, max_branches: int | None = None
    ) -> list[list[PreparedBranch]]:
        """Branches per sequence: all accepted first, then by accepted count and guess rank;
        at most `max_branches` each (None: every guess of every position)."""
        out: list[list[PreparedBranch]] = []
        for b, slot in enumerate(request.slots):
            drafts = self._outstanding.get(slot)
            k = request.num_to_draft[b]
            branches = [] if drafts is None or k <= 0 else self._branches(request, b, drafts, k)
            branches = branches[:max_branches] if max_branches else branches
            self._prepared[slot] = branches
            out.append(branches)
        return out

    def _branches(
        self, request: ProposeRequest, b: int, drafts: list[int], k: int
    ) -> list[PreparedBranch]:
        num_drafts, lookback = len(drafts), self.max_lookback
        # [L + m] the all-accepted sequence's tail: every branch's full lookup window
        tail = np.asarray(request.token_ids[b][-(lookback + num_drafts) :] + drafts, np.int64)
        branches = []
        for a in range(num_drafts, -1, -1):  # all accepted first
            prefix = tail[: len(tail) - (num_drafts - a)]  # committed + d_0..d_{a-1}
            guesses = self._candidates(prefix[-lookback:], self.branch_width + 1)
            if a < num_drafts:
                guesses = [t for t in guesses if t != drafts[a]]
            for guess in guesses[: self.branch_width]:
                window = np.append(prefix, guess)[-lookback:]
                record = DraftRecord()
                for token in self._lookup(window, k):
                    record.append(token, None, [])
                branches.append(PreparedBranch(a, guess, record))
        return branches

    def adopt(self, slot: int, branch: int, num_used: int, committed: list[int]) -> None:
        prepared = self._prepared.pop(slot, [])
        if branch == NO_BRANCH:
            self._outstanding[slot] = []  # a fresh proposal follows, or none
            return
        if not 0 <= branch < len(prepared):
            self._outstanding.pop(slot, None)
            raise RequestError(f"slot {slot}: no prepared branch {branch}")
        self._outstanding[slot] = prepared[branch].drafts.tokens[:num_used]
