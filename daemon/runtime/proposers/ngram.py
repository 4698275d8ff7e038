"""Prompt lookup / n-gram proposer: no model, no memory.

If the last n tokens of a sequence occurred earlier in it, propose the tokens that followed
that earlier occurrence (the most recent one). Longer n-grams are tried first.
"""

import time
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from daemon.runtime.proposers.base import Proposals, ProposeRequest, pack_draft_ids


@dataclass(slots=True)
class NgramProposer:
    max_ngram: int = 4
    min_ngram: int = 1
    max_lookback: int = 4096  # tokens searched backwards; bounds the per-round cost
    name: str = "ngram"

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(
                f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}"
            )

    def admit(self, slots: list[int], prompts: list[list[int]]) -> None:
        return None

    def release(self, slot: int) -> None:
        return None

    def propose(self, request: ProposeRequest) -> Proposals:
        start = time.perf_counter()
        drafts = [
            self.lookup(tokens, k) if k > 0 else []
            for tokens, k in zip(request.token_ids, request.num_to_draft, strict=True)
        ]
        return Proposals(
            draft_token_ids=pack_draft_ids(drafts),
            num_draft_tokens=[len(d) for d in drafts],
            draft_time_s=time.perf_counter() - start,
        )

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest suffix."""
        window = np.asarray(tokens[-self.max_lookback :], dtype=np.int64)  # [L]
        num_tokens = int(window.shape[0])
        for n in range(min(self.max_ngram, num_tokens - 1), self.min_ngram - 1, -1):
            # [L - n, n]: every earlier n-gram that has at least one token after it
            grams = sliding_window_view(window[:-1], n)
            hits = np.flatnonzero((grams == window[num_tokens - n :]).all(axis=1))
            if hits.size:
                begin = int(hits[-1]) + n  # the most recent occurrence
                return window[begin : begin + k].tolist()
        return []
