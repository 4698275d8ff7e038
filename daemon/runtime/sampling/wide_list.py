"""A sampled row's widened list: the draft's most likely tokens down to a mass, within a budget.

A row of logits at temperature T has q_i = exp(x_i / T - log Z). Its tokens fall into bins of
log q, counted down from the row's best token in steps of LOG_Q_BIN (bin b holds the tokens
between b and b + 1 steps below it; the last of NUM_LOG_Q_BINS holds everything further down).
The list takes whole bins, best first, while they fit in `max_listed` tokens, and stops after
the bin that brings its mass to the row's target. So every listed token is more likely than
every unlisted one (whole bins: no bin is split), the budget is never exceeded, and the list
covers the target unless the budget ends first. Within a bin the tokens come in id
order; the list's order is (bin, id), the same on every path.

On a CPU with the native kernels one C call does it for every row (a counting sort: a pass to
bin the tokens, one to place those of the bins that fit, exps for those only); elsewhere torch
sorts the bins (a few tensor ops over [W, V], cheap on a GPU). Both list the same tokens from
the same inputs (their float32 exps may differ in the last bits, so a cut that falls exactly
at the target could differ); a row whose best bin alone exceeds the budget, or that holds a
NaN, lists nothing (its caller keeps its base list).
"""

import torch

from daemon.runtime.model import native

LOG_Q_BIN = 1 / 32  # the cut falls between bins of log q this wide...
NUM_LOG_Q_BINS = 1024  # ...counted down to 32 nats below the best token (the rest: one bin)


def wide_lists(
    logits: torch.Tensor,  # [R, V] float32 (left as they are)
    rows: torch.Tensor,  # [W] int64 the rows to list
    temps: torch.Tensor,  # [W] float64 their temperatures (> 0)
    log_norms: torch.Tensor,  # [W] float64 log Z of each row at its temperature
    targets: torch.Tensor,  # [W] float64 the mass each list should cover
    max_listed: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> q [W, M] float32, ids [W, M] int64 (M = min(max_listed, V); padding: q 0, id 0) and
    how many each row lists [W] int64 (0: none, keep the base list), on the host."""
    vocab_size = logits.shape[-1]
    width = min(max_listed, vocab_size)
    module = native.for_rows(logits)
    if module is not None:
        return _native(module, logits, rows, temps, log_norms, targets, width)
    return _torch(logits, rows, temps, log_norms, targets, width)


def _native(
    module: object,
    logits: torch.Tensor,
    rows: torch.Tensor,
    temps: torch.Tensor,
    log_norms: torch.Tensor,
    targets: torch.Tensor,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    num = rows.shape[0]
    rows, inv_temps, log_norms, targets = (
        t.to("cpu", dtype).contiguous()
        for t, dtype in (
            (rows, torch.int64), (1.0 / temps.double(), torch.float64),
            (log_norms, torch.float64), (targets, torch.float64),
        )
    )  # fmt: skip
    # (the C call checks the rows against the logits: an IndexError where one is outside)
    ids = torch.empty(num, width, dtype=torch.int64)
    q = torch.empty(num, width, dtype=torch.float32)
    count = torch.empty(num, dtype=torch.int64)
    module.wide_list(  # type: ignore[attr-defined]
        logits.data_ptr(), logits.stride(0), logits.shape[1], num, rows.data_ptr(),
        inv_temps.data_ptr(), log_norms.data_ptr(), targets.data_ptr(), width, NUM_LOG_Q_BINS,
        round(1 / LOG_Q_BIN), ids.data_ptr(), q.data_ptr(), count.data_ptr(), logits.shape[0],
    )  # fmt: skip
    return q, ids, count


def _torch(
    logits: torch.Tensor,
    rows: torch.Tensor,
    temps: torch.Tensor,
    log_norms: torch.Tensor,
    targets: torch.Tensor,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    device = logits.device
    x = logits[rows.to(device)].double()  # [W, V]
    inv_t = (1.0 / temps.double()).to(device).unsqueeze(-1)  # [W, 1]
    ln = log_norms.to(device, torch.float64).unsqueeze(-1)  # [W, 1]
    log_q = x * inv_t - ln  # [W, V]
    best = x.amax(dim=-1, keepdim=True) * inv_t - ln  # [W, 1] as the C kernel rounds it
    below = (best - log_q) * round(1 / LOG_Q_BIN)
    bins = below.clamp(max=NUM_LOG_Q_BINS - 1).nan_to_num(NUM_LOG_Q_BINS - 1).long()  # >= 0
    sorted_bins, order = torch.sort(bins, dim=-1, stable=True)  # [W, V] by (bin, id)
    q_sorted = log_q.gather(-1, order).float().exp()  # [W, V] float32
    per_bin = torch.zeros(x.shape[0], NUM_LOG_Q_BINS, dtype=torch.int64, device=device)
    per_bin.scatter_add_(-1, bins, torch.ones_like(bins))
    bin_end = per_bin.cumsum(dim=-1).gather(-1, sorted_bins)  # [W, V] where a token's bin ends
    mass = q_sorted.double().cumsum(dim=-1)  # [W, V] the listed mass through each token
    # [W, V] the mass before each token's bin: the running mass where the bin before it ended
    bin_start = bin_end - per_bin.gather(-1, sorted_bins)
    mass_before = torch.where(
        bin_start > 0, mass.gather(-1, (bin_start - 1).clamp(min=0)), torch.zeros_like(mass)
    )
    keep = (bin_end <= width) & (mass_before < targets.to(device, torch.float64).unsqueeze(-1))
    unusable = torch.isnan(x).any(dim=-1) | torch.isinf(best.squeeze(-1))
    keep &= ~unusable.unsqueeze(-1)
    count = keep.sum(dim=-1)  # [W] keep is a prefix of the sorted order
    keep = keep[:, :width]
    q = torch.where(keep, q_sorted[:, :width], 0.0)
    ids = torch.where(keep, order[:, :width], 0)
    return q.cpu(), ids.cpu(), count.cpu()
