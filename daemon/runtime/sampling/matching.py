"""Verifying point-mass drafts by matching them against the target's own choice.

When no draft of a round carries a distribution (greedy drafts, n-gram lookups, coupled
drafting: proposers/draft_sampling.py), the verifier needs no probabilities at all. At every
position it makes its own choice, the argmax of the logits for a greedy row and for a sampled
row the Gumbel-max of the request's scaled, truncated logits with the position's field,
argmax_i (logits_i / T + G_i), found as argmax_i (logits_i + T G_i) without a pass dividing
the logits (gumbel_field.py); it accepts drafts while they equal its
choices and emits its choice where they stop (or after the last: the bonus). Every committed
token is the verifier's own choice, a Gumbel-max sample of the target's distribution with a
field no earlier verdict looked at, so the output is exactly what the target alone samples
with the same fields, whatever was drafted. rejection.py does the same for such drafts inside
mixed batches (there with log p, equal up to rounding); this path skips the softmax, the
residual and the inverse CDF, which at a real vocabulary are most of a round's sampling cost.
"""

import torch

from daemon.runtime.sampling.argmax import argmax_last
from daemon.runtime.sampling.gumbel_field import gumbel_argmax
from daemon.runtime.sampling.logits import apply_top_k_top_p

PLACEHOLDER_TOKEN_ID = -1


@torch.inference_mode()
def target_choices(
    logits: torch.Tensor,  # [B, T, V] float32 (left as they were)
    is_greedy: torch.Tensor,  # [B] bool
    temperature: torch.Tensor,  # [B] float32 (read for sampled rows)
    top_k: torch.Tensor,  # [B] int64, 0: off
    top_p: torch.Tensor,  # [B] float32, 1.0: off
    keys: torch.Tensor | None,  # [B, T] int64 field keys; None only when every row is greedy
    num_positions: torch.Tensor,  # [B] int64: positions each row needs (num_draft + 1)
    hints: torch.Tensor | None = None,  # [B, T'] int64 the drafts (T' <= T), < 0: none
) -> torch.Tensor:
    """[B, T] the verifier's choice at every position a row needs, -1 past them. `hints`:
    where a sampled row's draft is likely its choice (drafts coupled to the same field), the
    search for the choice starts from it and draws less; the choices are the same."""
    num_seqs, width, vocab_size = logits.shape
    device = logits.device
    choices = torch.full((num_seqs, width), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=device)
    # [B, T] positions a row's verdict can reach
    needed = torch.arange(width, device=device) < num_positions.to(device).unsqueeze(-1)
    greedy = is_greedy.to(device).unsqueeze(-1) & needed
    sampled = ~is_greedy.to(device).unsqueeze(-1) & needed
    flat = logits.reshape(num_seqs * width, vocab_size)  # a view for the model's logits
    if bool(greedy.any()):
        rows = greedy.flatten().nonzero().flatten()
        # most rows: one pass over all of them beats copying those needed first
        most = 2 * rows.numel() >= flat.shape[0]
        choices.view(-1)[rows] = argmax_last(flat)[rows] if most else argmax_last(flat[rows])
    if bool(sampled.any()):
        if keys is None:
            raise ValueError("keys are needed where a row samples")
        rows = sampled.flatten().nonzero().flatten()  # [N]
        seq = rows // width
        scores = flat if flat.is_contiguous() else flat.contiguous()
        row_keys = keys.to(device).flatten()[rows]  # [N]
        row_hints = None
        if hints is not None:  # [B, T] with -1 where no draft sits
            padded = torch.full((num_seqs, width), -1, dtype=torch.long)
            padded[:, : hints.shape[1]] = hints[:, :width]
            row_hints = padded.flatten()[rows.cpu()]  # [N]
        temps = temperature.to(device)[seq].float()  # [N]
        row_top_k, row_top_p = top_k.to(device)[seq], top_p.to(device)[seq]
        uses_top_k = (row_top_k > 0) & (row_top_k < vocab_size)
        uses_top_p = row_top_p < 1.0
        # each row by one rule whatever else is in the batch: a plain row as
        # argmax (logits + T G) = argmax (logits / T + G), the logits left alone; a truncated
        # row over a copy of its logits / T with the truncated tokens at -inf
        tokens = torch.empty_like(rows)
        plain = (~(uses_top_k | uses_top_p)).nonzero().flatten()
        if plain.numel():
            tokens[plain] = gumbel_argmax(
                scores,
                row_keys[plain],
                rows=rows[plain],
                noise_scale=temps[plain],
                hints=None if row_hints is None else row_hints[plain.cpu()],
            )
        cut = (uses_top_k | uses_top_p).nonzero().flatten()
        if cut.numel():
            picked = scores[rows[cut]] / temps[cut].unsqueeze(-1)  # [C, V]
            picked = apply_top_k_top_p(
                picked, row_top_k[cut], uses_top_k[cut], row_top_p[cut], uses_top_p[cut]
            )
            tokens[cut] = gumbel_argmax(
                picked, row_keys[cut], hints=None if row_hints is None else row_hints[cut.cpu()]
            )
        choices.view(-1)[rows] = tokens
    return choices


def accept_matching(
    draft_token_ids: torch.Tensor,  # [B, K] int64, PLACEHOLDER_TOKEN_ID past num_draft
    num_draft_tokens: torch.Tensor,  # [B] int64
    choices: torch.Tensor,  # [B, K+1] int64 the verifier's choice at every needed position
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept while draft == choice; then the choice where the drafts stop. Returns
    output_token_ids [B, K+1] (placeholders after the emitted token) and num_output [B]."""
    max_k = draft_token_ids.shape[1]
    device = draft_token_ids.device
    positions = torch.arange(max_k + 1, device=device)
    is_real = positions[:max_k] < num_draft_tokens.unsqueeze(-1)  # [B, K]
    accept = (draft_token_ids == choices[:, :max_k]) & is_real
    num_accepted = accept.long().cumprod(dim=-1).sum(dim=-1)  # [B]
    token = choices.gather(1, num_accepted.unsqueeze(-1))  # [B, 1]
    output = torch.where(
        positions < num_accepted.unsqueeze(-1), choices, PLACEHOLDER_TOKEN_ID
    )  # [B, K+1]: the accepted drafts equal the choices there
    output.scatter_(1, num_accepted.unsqueeze(-1), token)
    return output, num_accepted + 1
