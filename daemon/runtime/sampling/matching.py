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

from daemon.runtime.host_tensors import float32_tensor, int64_tensor
from daemon.runtime.sampling.argmax import argmax_last
from daemon.runtime.sampling.gumbel_field import field_key_runs, gumbel_argmax
from daemon.runtime.sampling.logits import apply_top_k_top_p
from daemon.runtime.sampling.params import SamplingParams

PLACEHOLDER_TOKEN_ID = -1


@torch.inference_mode()
def target_choices(
    logits: torch.Tensor,  # [B, T, V] float32 (left as they were)
    params: list[SamplingParams],  # [B] each row's rule
    num_positions: list[int],  # [B] positions each row needs (num_draft + 1), <= T
    fields: list[tuple[int, int]] | None,  # [B] (draft seed, absolute position of column 0)
    hints: list[list[int]] | None = None,  # [B] the drafts (column t's at hints[b][t])
) -> list[list[int]]:
    """[B][num_positions[b]] the verifier's choice at every position a row needs. A greedy row
    takes the argmax; a sampled row the Gumbel-max with the field of (draft seed, position),
    as argmax (logits + T G) = argmax (logits / T + G), the logits left alone, or over a copy
    of its logits / T with the truncated tokens at -inf where it uses top-k or top-p: each
    row by its own rule whatever else is in the batch. `fields` is needed where a row samples.
    `hints`: where a sampled row's draft is likely its choice (drafts coupled to the same
    field), the search for the choice starts from it and draws less; the choices are the
    same, except that a sampled row's choices after its first draft that is not its choice
    are not searched (gumbel_field.NOT_SEARCHED where the C search runs): `accept_matching`
    reads none of them. The rows are gathered on the host: one tensor each for their indices, keys,
    temperatures and hints, a search for each rule, one read of the choices back."""
    num_seqs, width, vocab_size = logits.shape
    flat = logits.reshape(num_seqs * width, vocab_size)  # a view for the model's logits
    choices = [[PLACEHOLDER_TOKEN_ID] * n for n in num_positions]
    greedy: list[tuple[int, int]] = []  # (row, column) cells by rule
    plain: list[tuple[int, int]] = []
    cut: list[tuple[int, int]] = []
    for b, (p, n) in enumerate(zip(params, num_positions, strict=True)):
        if not 0 <= n <= width:
            raise ValueError(f"row {b} needs {n} positions of the {width} scored")
        cells = [(b, t) for t in range(n)]
        if p.is_greedy:
            greedy += cells
        elif 0 < p.top_k < vocab_size or p.top_p < 1.0:
            cut += cells
        else:
            plain += cells
    if greedy:
        rows = int64_tensor([b * width + t for b, t in greedy]).to(logits.device)
        # most rows: one pass over all of them beats copying those needed first
        most = 2 * len(greedy) >= flat.shape[0]
        picked = argmax_last(flat)[rows] if most else argmax_last(flat[rows])
        _fill(choices, greedy, picked.tolist())
    if not (plain or cut):
        return choices
    if fields is None:
        raise ValueError("fields are needed where a row samples")
    scores = flat if flat.is_contiguous() else flat.contiguous()
    for cells, truncated in ((plain, False), (cut, True)):
        if not cells:
            continue
        seq_rows = list(dict.fromkeys(b for b, _ in cells))  # the rows, in order
        keys = _cell_keys(seq_rows, fields, num_positions)  # [N]
        temps = float32_tensor([params[b].temperature for b, _ in cells])  # [N]
        cell_hints = None
        if hints is not None:
            cell_hints = int64_tensor(
                [hints[b][t] if t < len(hints[b]) else -1 for b, t in cells]
            )  # [N]
        rows = int64_tensor([b * width + t for b, t in cells]).to(logits.device)  # [N]
        # each row's cells, one run: past its first draft that is not the choice, none is read
        runs = None if hints is None else [num_positions[b] for b in seq_rows]
        if not truncated:
            picked = gumbel_argmax(
                scores, keys, rows=rows, noise_scale=temps, hints=cell_hints, runs=runs
            )
        else:
            seq = [b for b, _ in cells]
            scaled = scores[rows] / temps.to(logits.device).unsqueeze(-1)  # [N, V]
            top_k = torch.tensor([params[b].top_k for b in seq], device=logits.device)
            top_p = torch.tensor([params[b].top_p for b in seq], device=logits.device)
            scaled = apply_top_k_top_p(
                scaled, top_k, (top_k > 0) & (top_k < vocab_size), top_p, top_p < 1.0
            )
            picked = gumbel_argmax(scaled, keys, hints=cell_hints, runs=runs)
        _fill(choices, cells, picked.tolist())
    return choices


def _cell_keys(
    rows: list[int], fields: list[tuple[int, int]], num_positions: list[int]
) -> torch.Tensor:
    """[N] int64: the field key of every cell of `rows` (in order): a row's cells are its
    columns 0 .. n - 1, one run of positions each."""
    return field_key_runs(
        [fields[b][0] for b in rows], [fields[b][1] for b in rows], [num_positions[b] for b in rows]
    )


def _fill(choices: list[list[int]], cells: list[tuple[int, int]], tokens: list[int]) -> None:
    for (b, t), token in zip(cells, tokens, strict=True):
        choices[b][t] = token


def accept_matching(drafts: list[list[int]], choices: list[list[int]]) -> list[list[int]]:
    """Accept while a row's drafts equal its choices; then its choice where they stop (or
    after the last: the bonus). Returns each row's emitted tokens (the accepted drafts, which
    equal the choices there, then that choice)."""
    emitted = []
    for row_drafts, row_choices in zip(drafts, choices, strict=True):
        if len(row_choices) < len(row_drafts) + 1:
            raise ValueError(
                f"{len(row_choices)} choices for {len(row_drafts)} drafts: one more is needed"
            )
        n = 0
        while n < len(row_drafts) and row_drafts[n] == row_choices[n]:
            n += 1
        emitted.append(row_choices[: n + 1])
    return emitted
