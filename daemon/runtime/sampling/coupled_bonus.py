"""The bonus token of a sampled row, drawn with the position's shared Gumbel field.

When every draft of a round is accepted, the verifier emits a bonus token from the target's
distribution p at the next position t. Any exact sample of p will do; this one is the
Gumbel-max y = argmax_i (log p_i + G_i) with G the field of (draft seed, t) (gumbel_field.py),
the noise a draft at t would have used. A drafter that pre-drafts the next round while this
one is verified (overlapped mode, proposers/branch_planner.py) guesses the bonus as
argmax_i (log q_i + G_i) with the same field, so its guess is right whenever the two
distributions pick the same token under shared noise: measured on the demo pair (code
prompts), 0.75 of bonus positions at temperature 1.0 and 0.7, where guessing the draft's most
likely token is right 0.27 and 0.42 of the time (the total-variation bound, sum min(p, q), is
0.80 and 0.79 there). The drafter's best next guesses stay its other likeliest tokens.

Why this stays exact. A position's field decides at most one committed token (see
rejection.py): position t is the bonus position of this round, so no draft at t was examined
(an examined position is committed in its round) and the field of t is independent of
everything the verifier has looked at; y is then an exact sample of p at t. Drafts at t made
before (past an earlier round's stop) were never examined, and the drafter's guess only
chooses which pre-drafted branch is offered next: the drafts in it sit at positions after t,
with their own fields.
"""

import torch

from daemon.runtime.sampling.gumbel_field import gumbel_argmax_at


def couple_bonus_tokens(
    output_token_ids: torch.Tensor,  # [B, K+1] int64, updated in place
    num_output_tokens: torch.Tensor,  # [B] int64 = accepted + 1
    num_draft_tokens: torch.Tensor,  # [B] int64
    target_probs: torch.Tensor,  # [B, K+1, V] float32 (left as it was)
    is_greedy: torch.Tensor,  # [B] bool
    bonus_keys: torch.Tensor,  # [B] int64 the field key of each row's bonus position
) -> torch.Tensor:
    """Replaces the bonus token of every sampled row that accepted all its drafts with the
    field's Gumbel-max of p there; returns `output_token_ids`."""
    num_accepted = num_output_tokens - 1
    tokens = bonus_tokens(num_accepted, num_draft_tokens, target_probs, is_greedy, bonus_keys)
    rows = (tokens >= 0).nonzero().flatten()  # [N]
    if rows.numel():
        output_token_ids[rows, num_accepted[rows]] = tokens[rows]
    return output_token_ids


def bonus_tokens(
    num_accepted: torch.Tensor,  # [B] int64
    num_draft_tokens: torch.Tensor,  # [B] int64
    target_probs: torch.Tensor,  # [B, K+1, V] float32 (left as it was)
    is_greedy: torch.Tensor,  # [B] bool
    bonus_keys: torch.Tensor,  # [B] int64 the field key of each row's bonus position
) -> torch.Tensor:
    """[B] the field's Gumbel-max of p at the bonus position of every sampled row that
    accepted all its drafts; -1 at the other rows, and where no token has any probability
    (not a distribution: the caller's own sample stands there)."""
    num_seqs = target_probs.shape[0]
    if bonus_keys.shape != (num_seqs,):
        raise ValueError(f"bonus_keys must be [{num_seqs}], got {list(bonus_keys.shape)}")
    device = target_probs.device
    num_accepted, num_draft_tokens = num_accepted.to(device), num_draft_tokens.to(device)
    tokens = torch.full((num_seqs,), -1, dtype=torch.long, device=device)
    is_bonus = (num_accepted == num_draft_tokens) & ~is_greedy.to(device)
    rows = is_bonus.nonzero().flatten()  # [N]
    if rows.numel():
        at = num_draft_tokens[rows]  # [N] the bonus position in each row
        keys = bonus_keys.to(device)[rows]
        tokens[rows] = gumbel_argmax_at(target_probs, rows, at, keys, are_probs=True)
    return tokens
