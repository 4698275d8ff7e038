"""The one contract between a proposer (draft model, n-gram lookup) and the verifier."""

from dataclasses import dataclass
from typing import Protocol

import torch

from daemon.runtime.sampling.params import SamplingParams

PLACEHOLDER_TOKEN_ID = -1


@dataclass(slots=True)
class ProposeRequest:
    """What the verifier asks of the proposer for one round (B running sequences)."""

    slots: list[int]  # [B] the sequences' slots (shared numbering with the verifier)
    token_ids: list[list[int]]  # [B] each sequence's committed tokens (prompt + output); read-only
    num_to_draft: list[int]  # [B] k_b >= 0; the proposer may return fewer, never more
    params: list[SamplingParams]  # [B]
    # [B] per-request draft seeds: a sampled draft at absolute position p of request b is a
    # function of (draft_seeds[b], p) alone (see sampling/keyed_random.py); unused if greedy
    draft_seeds: list[int]
    # sampled drafts this round go as coupled drafts (the token alone), whatever list width
    # the proposer was built with (engine/proposal_chooser.py); a proposer that cannot may
    # ignore it: either form is exact
    coupled: bool = False


@dataclass(slots=True)
class Proposals:
    """Draft tokens for one round. Only tokens sampled from exactly the distribution returned
    may be proposed: that is what keeps verification lossless.

    `sparse_ids`/`sparse_probs`/`sparse_tail` hold, for sampled drafts, the distribution each
    draft token was drawn from: probs[s] on ids[s], and the tail mass on the tokens not listed
    with a positive prob (its token picked with the position's Gumbel field: see
    sampling/rejection.py). A position whose probs and
    tail are all zero (or `sparse_ids is None` for the whole batch) was proposed
    deterministically: a point mass on the draft token (greedy drafting, n-gram lookup).
    """

    draft_token_ids: torch.Tensor  # [B, K] int64, PLACEHOLDER_TOKEN_ID past num_draft_tokens[b]
    num_draft_tokens: list[int]  # [B], each <= the k asked for
    sparse_ids: torch.Tensor | None = None  # [B, K, S] int64
    sparse_probs: torch.Tensor | None = None  # [B, K, S] float32
    sparse_tail: torch.Tensor | None = None  # [B, K] float32; None: no tails
    draft_time_s: float = 0.0  # time in the proposer's forward passes

    @property
    def max_k(self) -> int:
        return int(self.draft_token_ids.shape[1])


def empty_proposals(num_seqs: int) -> Proposals:
    """No drafts for anyone (k = 0 everywhere)."""
    return Proposals(
        draft_token_ids=torch.full((num_seqs, 0), PLACEHOLDER_TOKEN_ID, dtype=torch.long),
        num_draft_tokens=[0] * num_seqs,
    )


def pack_draft_ids(drafts: list[list[int]]) -> torch.Tensor:
    """Ragged per-sequence drafts -> [B, K] int64 padded with PLACEHOLDER_TOKEN_ID."""
    max_k = max((len(d) for d in drafts), default=0)
    out = torch.full((len(drafts), max_k), PLACEHOLDER_TOKEN_ID, dtype=torch.long)
    for row, draft in enumerate(drafts):
        if draft:
            out[row, : len(draft)] = torch.tensor(draft, dtype=torch.long)
    return out


class Proposer(Protocol):
    """A source of draft tokens. `admit` and `release` bracket a sequence's life."""

    name: str

    def admit(self, slots: list[int], prompts: list[list[int]]) -> None:
        """New sequences joined (a draft model checks them here and prefills them at their
        first drafts)."""
        ...

    def propose(self, request: ProposeRequest) -> Proposals:
        """Draft up to num_to_draft[b] tokens after each sequence's committed tokens."""
        ...

    def release(self, slot: int) -> None:
        """The sequence in `slot` finished; forget it."""
        ...
