"""Exact, compact sparse proposals: integer counts out of N = 2^15.

A sampled draft position's distribution is sent as its top-S tokens with their probabilities
and a tail: the rest of its mass, on the tokens not listed (with a positive count). At a real
vocabulary and a flat distribution (high temperature, creative text) the top tokens hold
little of the mass, and a proposal truncated to them would make the verifier reject nearly
every draft; the tail keeps the proposal as small and still lets the drafts that come from
the rest of the vocabulary be accepted. How the tail's token is picked and tested (a shared
Gumbel field, the target's shape on the unlisted tokens) is in sampling/rejection.py.

The top-S probabilities and the tail are rounded to integer counts that sum to exactly N:
each entry's count is the difference of the rounded running sums, N * (q_1 + ... + q_i)
rounded to the nearest integer (halves up), so every count is within one of N q_i, one of at
least 1 keeps a count, and the rounding is one pass with no sort, however many tokens a
draft lists (a wide list holds thousands: proposers/tail_verdicts.py). The draft token is
drawn from those counts with an integer draw u in [0, N): the entry whose cumulative range
[c_{i-1}, c_i) holds u. The verifier receives the counts and uses q = count / N, which
float32 holds exactly (N is a power of two and counts are < 2^24), and tail / N for the class
of unlisted tokens.

So the numbers the drafter sampled from and the numbers the verifier tests against are the
same integers on any hardware, in any process: that is what keeps a remote proposal lossless.
Listed tokens whose count rounds to 0 join the unlisted ones (drawn only through the tail,
with its share). Counts fit in uint16 (at most N = 32768).
"""

import torch

from daemon.runtime.model import native

PROPOSAL_BITS = 15
PROPOSAL_TOTAL = 1 << PROPOSAL_BITS  # N: counts of one position sum to exactly this
MAX_LISTED = 4095  # tokens one proposal lists on the wire
_NOT_QUANTISABLE = "probabilities could not be quantised (non-finite or all zero)"


def quantize_counts(probs: torch.Tensor) -> torch.Tensor:
    """probs [R, S] (rows sum to ~1, non-negative) -> counts [R, S] int64, rows summing to
    PROPOSAL_TOTAL exactly: the differences of the rounded running sums (module doc)."""
    if probs.dim() != 2 or probs.shape[-1] == 0:
        raise ValueError(f"probs must be [R, S] with S >= 1, got shape {tuple(probs.shape)}")
    # float64 makes the sums robust; the rounding rule, not the precision, makes it exact.
    exact = probs.double().clamp(min=0.0)
    running = exact.cumsum(dim=-1)  # [R, S]
    running = running / running[:, -1:] * PROPOSAL_TOTAL
    # [R, S] rounded running sums, the last exactly N (halves up: floor(x + 1/2))
    rounded = (running + 0.5).floor().long()
    rounded[:, -1] = PROPOSAL_TOTAL
    counts = torch.diff(rounded, dim=-1, prepend=torch.zeros_like(rounded[:, :1]))
    if bool((counts < 0).any()) or bool((counts.sum(dim=-1) != PROPOSAL_TOTAL).any()):
        raise ValueError(_NOT_QUANTISABLE)
    return counts


def quantize_with_tail(
    probs: torch.Tensor,  # [R, S] the top-S probabilities (not renormalised)
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> counts [R, S] int64 and tail counts [R] int64 (the mass outside the S tokens),
    together summing to PROPOSAL_TOTAL per row."""
    if probs.dim() != 2 or probs.shape[-1] == 0:
        raise ValueError(f"probs must be [R, S] with S >= 1, got shape {tuple(probs.shape)}")
    exact = probs.double()
    if not bool(torch.isfinite(exact).all()):
        raise ValueError(_NOT_QUANTISABLE)
    # [R, 1] the mass outside the list: 1 - the entries' sum, taken left to right (a cumsum,
    # not torch's blocked sum) as the native kernel takes it, so both give the same bits
    tail = (1.0 - exact.cumsum(dim=-1)[:, -1:]).clamp(min=0.0)
    counts = quantize_counts(torch.cat([exact.clamp(min=0.0), tail], dim=-1))
    return counts[:, :-1], counts[:, -1]


def quantize_and_draw(
    probs: torch.Tensor,  # [R, S] float32 the listed probabilities (not renormalised)
    ids: torch.Tensor,  # [R, S] int64 their token ids
    draws: torch.Tensor,  # [R] int64 in [0, PROPOSAL_TOTAL)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A drafter's listed rows quantised and drawn from: `quantize_with_tail`, then
    `sample_from_counts` over [counts..., tail]. -> counts [R, S] int64, tails [R] int64, the
    token each draw picks [R] int64 (-1: the tail, whose token the caller draws) and the ids
    a tail draw excludes [R, S] int64 (the listed ids with a positive count, else -1). One C
    call on a CPU with the native kernels (the same bits); torch's ops elsewhere."""
    if probs.dim() != 2 or probs.shape[-1] == 0 or ids.shape != probs.shape:
        raise ValueError(
            f"need probs and ids [R, S] with S >= 1, got {tuple(probs.shape)}, {tuple(ids.shape)}"
        )
    rows, width = probs.shape
    if draws.shape != (rows,):
        raise ValueError(f"need draws [R={rows}], got {tuple(draws.shape)}")
    module = native.for_rows(probs)
    if (
        module is None
        or draws.dtype != torch.int64
        or ids.dtype != torch.int64
        or draws.device.type != "cpu"
        or ids.device.type != "cpu"
        or ids.stride(-1) != 1
        or ids.stride(0) < width  # rows that overlap (an expanded tensor): torch's ops
    ):
        counts, tails = quantize_with_tail(probs)
        choice = sample_from_counts(torch.cat([counts, tails.unsqueeze(-1)], -1), draws)
        picked = ids.gather(-1, choice.clamp(max=width - 1).unsqueeze(-1)).squeeze(-1)
        tokens = torch.where(choice < width, picked, -1)
        return counts, tails, tokens, torch.where(counts > 0, ids, -1)
    draws = draws.contiguous()
    counts = torch.empty(rows, width, dtype=torch.int64)
    tails = torch.empty(rows, dtype=torch.int64)
    tokens = torch.empty(rows, dtype=torch.int64)
    excluded = torch.empty(rows, width, dtype=torch.int64)
    ok = module.quantize_draw(
        probs.data_ptr(), probs.stride(0), rows, width, PROPOSAL_TOTAL, draws.data_ptr(),
        ids.data_ptr(), ids.stride(0), counts.data_ptr(), tails.data_ptr(), tokens.data_ptr(),
        excluded.data_ptr(),
    )  # fmt: skip
    if not ok:
        raise ValueError(_NOT_QUANTISABLE)
    return counts, tails, tokens, excluded


def unlisted_token(listed: list[int], vocab_size: int, word: int) -> int:
    """The uniformly random token outside `listed` (distinct ids) picked by the 64-bit random
    `word` (the drafter's fallback when no unlisted token has any probability): index
    (word * n) >> 64 among the n = V - L unlisted tokens in id order (a bias of at most
    n / 2^64)."""
    num_unlisted = vocab_size - len(listed)
    if num_unlisted <= 0:
        raise ValueError("every token is listed: no tail to draw from")
    token = (word * num_unlisted) >> 64
    for listed_id in sorted(listed):  # the index-th unlisted id: skip the listed ones below it
        if listed_id <= token:
            token += 1
    return token


def sample_from_counts(counts: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """counts [R, S] int64 (rows sum to PROPOSAL_TOTAL), draws [R] int64 in [0, N) ->
    the index [R] of the entry whose cumulative range [c_{i-1}, c_i) holds the draw."""
    if counts.dim() != 2 or draws.shape != counts.shape[:1]:
        raise ValueError(
            f"need counts [R, S] and draws [R], got {tuple(counts.shape)}, {tuple(draws.shape)}"
        )
    if bool(((draws < 0) | (draws >= PROPOSAL_TOTAL)).any()):
        raise ValueError(f"draws must be in [0, {PROPOSAL_TOTAL})")
    # [R, S] end of each entry's range; zero-count entries have an empty range, never chosen
    ends = counts.cumsum(dim=-1)
    return (ends <= draws.unsqueeze(-1)).sum(dim=-1)


def counts_to_probs(counts: torch.Tensor) -> torch.Tensor:
    """Counts -> q = count / N as float32: exact (a power-of-two denominator)."""
    return counts.to(torch.float32) / PROPOSAL_TOTAL
