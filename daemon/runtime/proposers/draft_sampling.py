"""How a draft model turns its logits into proposals.

Greedy requests draft the argmax (a point mass). Sampled requests draft from the draft's own
distribution at the request's temperature, truncated to its top `sparse_top_k` tokens and
renormalised; that sparse (ids, probs) pair is what the verifier receives, so the rejection
sampler knows q exactly and the output keeps the target's distribution.
"""

import torch

from daemon.runtime.proposers.base import PLACEHOLDER_TOKEN_ID, Proposals, ProposeRequest
from daemon.runtime.sampling.logits import process_logits, sparse_top_k
from daemon.runtime.sampling.random import sample_sparse


class DraftSampler:
    """Collects one round's draft tokens (and their sparse distributions) step by step."""

    def __init__(self, sparse_top_k: int) -> None:
        if sparse_top_k < 1:
            raise ValueError(f"sparse_top_k must be >= 1, got {sparse_top_k}")
        self.sparse_top_k = sparse_top_k
        self._request: ProposeRequest | None = None
        self._drafts = torch.empty(0, 0, dtype=torch.long)  # [B, K]
        self._num: list[int] = []
        self._sparse_ids: torch.Tensor | None = None  # [B, K, S]
        self._sparse_probs: torch.Tensor | None = None  # [B, K, S]

    def begin(self, request: ProposeRequest, max_k: int) -> None:
        num_seqs = len(request.slots)
        self._request = request
        self._drafts = torch.full((num_seqs, max_k), PLACEHOLDER_TOKEN_ID, dtype=torch.long)
        self._num = [0] * num_seqs
        self._sparse_ids = self._sparse_probs = None
        if any(not p.is_greedy for p in request.params):
            self._sparse_ids = torch.zeros((num_seqs, max_k, self.sparse_top_k), dtype=torch.long)
            self._sparse_probs = torch.zeros((num_seqs, max_k, self.sparse_top_k))

    def sample(self, logits: torch.Tensor, rows: list[int], step: int) -> list[int]:
        """logits: [A, V] float32 for the sequences in `rows`; returns one token per row."""
        assert self._request is not None
        params = [self._request.params[r] for r in rows]
        tokens = logits.argmax(dim=-1)  # [A]
        sampled = [i for i, p in enumerate(params) if not p.is_greedy]
        if sampled:
            tokens[sampled] = self._sample_rows(logits[sampled], [rows[i] for i in sampled], step)
        self._drafts[rows, step] = tokens
        for r in rows:
            self._num[r] = step + 1
        return tokens.tolist()

    def _sample_rows(self, logits: torch.Tensor, rows: list[int], step: int) -> torch.Tensor:
        """logits: [A', V]; draws from the sparse top-k distribution and records it."""
        assert self._request is not None and self._sparse_ids is not None
        assert self._sparse_probs is not None
        temperature = torch.tensor([self._request.params[r].temperature for r in rows])
        num_rows = len(rows)
        probs = process_logits(  # [A', V]
            logits,
            temperature,
            torch.zeros(num_rows, dtype=torch.long),
            torch.ones(num_rows),
        )
        ids, sparse = sparse_top_k(probs, min(self.sparse_top_k, probs.shape[-1]))  # [A', S]
        width = ids.shape[-1]
        self._sparse_ids[rows, step, :width] = ids
        self._sparse_probs[rows, step, :width] = sparse
        return sample_sparse(ids, sparse, [self._request.generators[r] for r in rows])

    def finish(self) -> Proposals:
        return Proposals(
            draft_token_ids=self._drafts,
            num_draft_tokens=self._num,
            sparse_ids=self._sparse_ids,
            sparse_probs=self._sparse_probs,
        )
