"""A draft step's listed proposals in one C call (proposers/draft_sampling.py's fast path).

A sampled draft step lists each row's best tokens with their probabilities (and, where they
cover too little of the row's mass, a widened list: sampling/wide_list.py), quantises the
list with its tail (sampling/quantized.py) and draws from it with the row's keyed draw
(sampling/keyed_random.py). Done as separate calls, with torch's glue between them, that
costs ~540 us a step for 16 rows of the demo pair's 4,096 tokens, of which the kernels are
~250. Here one C call runs the same steps row by row: log normaliser, top-S, q in doubles as
torch computes them, the widening test (the base list's doubles summed left to right against
the row's target), the widened list, quantisation and the draw.

The outputs are those of the separate calls: the same functions compute them, except the
base list's exps (libm's double exp here, torch's vectorised one there), which round to the
same float32 unless a double lands within an ulp of a float32 rounding boundary (about one
value in 2^28). Rows the kernel cannot take (a NaN, no finite max, nothing to quantise) make it
return None: the caller's separate calls decide them as they always did.
"""

from dataclasses import dataclass

import torch

from daemon.runtime.model import native
from daemon.runtime.sampling import block_maxima
from daemon.runtime.sampling.quantized import PROPOSAL_BITS, PROPOSAL_TOTAL
from daemon.runtime.sampling.wide_list import LOG_Q_BIN, NUM_LOG_Q_BINS

MAX_POSITION = (1 << 63) - 1  # what the C call reads as int64


@dataclass(slots=True)
class ListedRows:
    """A step's rows, quantised and drawn; W = the widest row's list (at least S)."""

    ids: torch.Tensor  # [A, W] int64 each row's listed ids (past its list: 0)
    counts: torch.Tensor  # [A, W] int64 their counts out of PROPOSAL_TOTAL (past: 0)
    excluded: torch.Tensor  # [A, W] int64 the ids with a positive count, else -1
    tails: list[int]  # [A] the tail's count
    tokens: list[int]  # [A] the listed token each draw picked (-1: the tail's)
    num_widened: int  # rows whose list widened past S


def draft_lists(
    logits: torch.Tensor,  # [A, V] float32 (left as they are)
    temperatures: list[float],  # [A] > 0 (rounded to float32, as torch.tensor rounds them)
    seeds: list[int],  # [A] draft seeds (keyed_random)
    positions: list[int],  # [A] absolute positions of the tokens drafted
    targets: list[float],  # [A] the mass a row's list should cover before it widens
    top: int,  # S, the base list's length
    max_listed: int,  # tokens a list may widen to (<= S: never)
) -> ListedRows | None:
    """The rows' listed proposals, or None where the C call does not run (no kernels, not
    float32 rows on the host, S over V / 64) or a row is one it leaves to the separate calls."""
    module = native.for_rows(logits)
    num_rows, vocab = logits.shape
    if (
        module is None
        or not 1 <= top <= vocab // block_maxima.BLOCK
        or num_rows == 0
        or logits.stride(0) < vocab  # rows that overlap (an expanded tensor)
        or max(positions) > MAX_POSITION  # (seeds of any size are taken modulo 2^64 in C)
    ):
        return None
    wide_max = min(max_listed, vocab) if max_listed > top else top
    width = max(top, wide_max)
    maxima = block_maxima.lookup_rows(logits)  # [A, nb] or None
    # [A, W] int64 each: ids, counts, excluded ids, rows W apart
    out = torch.empty(3, num_rows, width, dtype=torch.int64)
    found = module.draft_lists(
        logits.data_ptr(), logits.stride(0), num_rows, vocab,
        0 if maxima is None else maxima.data_ptr(), 0 if maxima is None else maxima.stride(0),
        temperatures, seeds, positions, targets, top, width, wide_max, NUM_LOG_Q_BINS,
        round(1 / LOG_Q_BIN), PROPOSAL_TOTAL, PROPOSAL_BITS, out[0].data_ptr(),
        out[1].data_ptr(), out[2].data_ptr(),
    )  # fmt: skip
    if found is False:
        return None
    tails, tokens, lengths = found
    used = max(top, max(lengths))  # the rows are padded to the widest (C)
    ids, counts, excluded = out[:, :, :used].unbind(0)
    return ListedRows(ids, counts, excluded, tails, tokens, sum(1 for n in lengths if n > 0))
