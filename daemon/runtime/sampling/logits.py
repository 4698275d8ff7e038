"""Logits -> the distribution a request samples from.

Temperature, then top-k, then top-p (the HF / vLLM order), always keeping at least one token.
Greedy rows (temperature 0) get the plain softmax at temperature 1: its argmax is the argmax of
the logits, and the rejection sampler only looks at that argmax for greedy rows.
"""

import contextlib

import torch

from daemon.runtime.model import native
from daemon.runtime.sampling import block_maxima

GREEDY_TEMPERATURE = 0.0
TOP_K_OFF = 0
TOP_P_OFF = 1.0


def process_logits(
    logits: torch.Tensor,  # [N, V] float32
    temperature: torch.Tensor,  # [N] float32, 0 = greedy
    top_k: torch.Tensor,  # [N] int64, 0 = off
    top_p: torch.Tensor,  # [N] float32, 1.0 = off
    inplace: bool = False,
) -> torch.Tensor:
    """Returns probs [N, V] float32, each row summing to 1, truncation applied.

    `inplace` (float32 contiguous logits the caller no longer needs): the probabilities
    overwrite the logits. At a real vocabulary the logits of a verify pass are tens of MB,
    and a fresh buffer of that size costs more in page faults than the softmax itself."""
    _check_process_args(logits, temperature, top_k, top_p)
    # the parameters are built on the host; the logits may be on a GPU
    temperature, top_k, top_p = (t.to(logits.device) for t in (temperature, top_k, top_p))
    vocab_size = logits.shape[-1]
    # Greedy rows: temperature 1, so the softmax keeps the logits' order.
    temperature = torch.where(temperature == GREEDY_TEMPERATURE, 1.0, temperature)
    inplace = inplace and logits.dtype == torch.float32 and logits.is_contiguous()
    # [N]
    uses_top_k = (top_k > TOP_K_OFF) & (top_k < vocab_size)
    uses_top_p = top_p < TOP_P_OFF
    truncates = vocab_size > 0 and bool((uses_top_k | uses_top_p).any())
    if inplace:  # the C softmax reads the logits' block maxima and leaves the probabilities'
        if not truncates and _native_softmax_(logits, temperature):
            return logits
        block_maxima.forget(logits)  # torch writes in place below
    # logits made under inference mode may only be updated in place under it
    needs_mode = inplace and logits.is_inference() and not torch.is_inference_mode_enabled()
    with torch.inference_mode() if needs_mode else contextlib.nullcontext():
        # [N, V]
        if not bool((temperature != 1.0).any()):  # a pass over [N, V] saved
            scaled = logits if inplace else logits.float()
        elif inplace:
            scaled = logits.div_(temperature.float().unsqueeze(-1))
        else:
            scaled = logits.float() / temperature.float().unsqueeze(-1)
        if truncates:
            scaled = apply_top_k_top_p(scaled, top_k, uses_top_k, top_p, uses_top_p)
        if inplace:  # the row-wise kernel reads each entry before writing it: safe in place
            return torch.ops.aten._softmax.out(scaled, -1, False, out=scaled)
        return torch.softmax(scaled, dim=-1)


def softmax_at_temperatures_(
    logits: torch.Tensor,  # [N, V] float32, overwritten where it returns True
    temperatures: list[float],  # [N] per row, 0 = greedy (the softmax at 1)
) -> bool:
    """`process_logits(logits, temperatures, no top-k, no top-p, inplace=True)` in one C call,
    for callers that know on the host that no row truncates (a verify pass's sampled rows,
    usually): the same probabilities, without the parameter tensors and checks that cost
    more than the softmax at a small vocabulary. False (the logits untouched) where the C
    softmax does not run: the caller calls process_logits."""
    if len(temperatures) != logits.shape[0] or not logits.is_contiguous():
        return False
    # float32, as process_logits takes them, so the same 1 / T
    temperature = torch.tensor(
        [1.0 if t == GREEDY_TEMPERATURE else t for t in temperatures], dtype=torch.float32
    )
    return _native_softmax_(logits, temperature)


def _native_softmax_(
    logits: torch.Tensor,  # [N, V] float32 contiguous, overwritten
    temperature: torch.Tensor,  # [N] > 0
) -> bool:
    """softmax(logits / T) in place in C: the exps written in one pass (each row's max from
    the LM head's block maxima where it left them), then scaled, where torch makes a division
    pass and three softmax passes over [N, V]. The scaling pass also takes the probabilities'
    block maxima, which replace the logits' (block_maxima.py): the Gumbel races over them
    (rejection.py) read a block only where it can win. False (the logits untouched) where
    the kernels do not run or a row's max is not finite."""
    module = native.for_rows(logits)
    if module is None or not logits.numel():
        return False
    num_rows, vocab = logits.shape
    inverse = (1.0 / temperature.double()).contiguous()  # [N]
    maxima = block_maxima.lookup_rows(logits)  # [N, nb] or None
    prob_maxima = torch.empty(num_rows, -(-vocab // block_maxima.BLOCK))  # [N, nb]
    written = bool(
        module.softmax_(
            logits.data_ptr(),
            vocab,
            num_rows,
            vocab,
            inverse.data_ptr(),
            0 if maxima is None else maxima.data_ptr(),
            0 if maxima is None else maxima.stride(0),
            prob_maxima.data_ptr(),
        )
    )
    if written:
        block_maxima.forget(logits)
        block_maxima.remember(logits, prob_maxima)
    return written


def apply_top_k_top_p(
    logits: torch.Tensor,  # [N, V]
    top_k: torch.Tensor,  # [N]
    uses_top_k: torch.Tensor,  # [N] bool
    top_p: torch.Tensor,  # [N]
    uses_top_p: torch.Tensor,  # [N] bool
) -> torch.Tensor:
    """Masks truncated tokens to -inf. One descending sort serves both filters."""
    # [N, V]
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    # top-k by value: keep every token >= the k-th largest logit (ties at the k-th are kept).
    # [N]
    kth_rank = (top_k.clamp(min=1, max=logits.shape[-1]) - 1).unsqueeze(-1)
    kth_value = sorted_logits.gather(-1, kth_rank)  # [N, 1]
    kth_value = torch.where(uses_top_k.unsqueeze(-1), kth_value, float("-inf"))
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_value, float("-inf"))
    # top-p: keep the smallest prefix whose mass reaches top_p, i.e. drop token i when the
    # mass strictly before it already reaches top_p. The most likely token is always kept.
    # [N, V]
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop = (mass_before >= top_p.unsqueeze(-1)) & uses_top_p.unsqueeze(-1)
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    # [N, V] back to vocabulary order
    return torch.empty_like(logits).scatter_(-1, sorted_idx, sorted_logits)


def sparse_top_k(
    probs: torch.Tensor,  # [N, V] float32
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely tokens, renormalised: ids [N, k] int64, probs [N, k] float32.

    A proposal with no tail (all its mass on the k tokens): valid for the rejection sampler
    when the draft samples from exactly this (see `random.sample_sparse`). Draft models send
    the top tokens with their own probabilities and a tail instead (quantized.py).
    """
    if probs.dim() != 2:
        raise ValueError(f"probs must be [N, V], got shape {tuple(probs.shape)}")
    if not 1 <= k <= probs.shape[-1]:
        raise ValueError(f"k must be in [1, vocab_size={probs.shape[-1]}], got {k}")
    # [N, k]
    top_probs, top_ids = top_k(probs.float(), k)
    top_probs = top_probs / top_probs.sum(dim=-1, keepdim=True)
    return top_ids, top_probs


TOP_K_BLOCK = 64  # entries per block of the two-stage top-k


def top_k(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """values [N, V] -> the k largest values [N, k] (descending) and their ids [N, k].

    torch.topk over a real vocabulary costs ~0.2 ms a row on one CPU core. Two stages cost a
    fifth of that: the max of each block of TOP_K_BLOCK entries, the k blocks with the largest
    maxima, then the top k of those blocks' entries (and the partial last block's). Exact: an
    entry among the k largest lies in a block whose max is at least the k-th largest value,
    and at most k blocks can have such a max, so the k chosen blocks hold them all. In C where
    the native kernels run (_native_top_k) and k is at most the number of blocks, at any
    vocabulary: there the candidates are only the entries at or above the k-th largest block
    max (16 rows of 4,096, k = 32: 30 us against torch.topk's 75)."""
    num_rows, vocab = values.shape
    # the C path where k is at most the number of blocks (a full list's k: a heap of k over
    # every entry, slower than torch's sort from k ~ V / 32 on; V = 151,936, k = 4,096: 20.1
    # against 17.3 ms for 16 rows)
    if values.device.type == "cpu" and 1 <= k <= vocab // TOP_K_BLOCK:
        found = _native_top_k(values, k)
        if found is not None:
            return found
    num_blocks = vocab // TOP_K_BLOCK
    if num_blocks <= 4 * k or values.device.type != "cpu":
        return values.topk(k, dim=-1)
    full = num_blocks * TOP_K_BLOCK
    # [N, nb] block maxima -> [N, k] the blocks that hold the top k
    known = block_maxima.lookup(values) if TOP_K_BLOCK == block_maxima.BLOCK else None
    if known is not None:  # the LM head's (its last, partial block is the rest's below)
        block_max = known[:, :num_blocks]
    else:
        block_max = values[:, :full].reshape(num_rows, num_blocks, TOP_K_BLOCK).amax(dim=-1)
    blocks = block_max.topk(k, dim=-1).indices
    # [N, k * BLOCK + rest] candidate ids: the chosen blocks' entries and the partial block
    within = torch.arange(TOP_K_BLOCK, device=values.device)
    ids = (blocks.unsqueeze(-1) * TOP_K_BLOCK + within).reshape(num_rows, -1)
    if full < vocab:
        rest = torch.arange(full, vocab, device=values.device).expand(num_rows, -1)
        ids = torch.cat([ids, rest], dim=-1)
    top, picked = values.gather(-1, ids).topk(k, dim=-1)
    return top, ids.gather(-1, picked)


def _native_top_k(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The two stages in C: a heap of the k largest block maxima, then a heap of k over the
    entries at or above the k-th of them (~16 us a row at V = 151,936 from the LM head's
    maxima, where torch's small ops cost ~35); None where the kernels do not run or a row
    holds a NaN (torch.topk decides those)."""
    module = native.for_rows(values)
    if module is None or TOP_K_BLOCK != block_maxima.BLOCK:
        return None
    num_rows, vocab = values.shape
    maxima = block_maxima.lookup_rows(values)  # [N, nb] or None
    top = torch.empty(num_rows, k)  # [N, k]
    ids = torch.empty(num_rows, k, dtype=torch.long)  # [N, k]
    found = module.top_k(
        values.data_ptr(),
        values.stride(0),
        num_rows,
        vocab,
        k,
        0 if maxima is None else maxima.data_ptr(),
        0 if maxima is None else maxima.stride(0),
        top.data_ptr(),
        ids.data_ptr(),
    )
    return (top, ids) if found else None


def log_normalizers(
    logits: torch.Tensor,  # [N, V] float32
    temperature: torch.Tensor,  # [N] > 0
) -> torch.Tensor:
    """[N] float64 log sum_i exp(logits_i / T) per row: the log denominator of the softmax at
    temperature T, so that p_i = exp(logits_i / T - it). One read of the logits in C where
    the native kernels run (the row's max from the LM head's block maxima when it left
    them), against torch's division, max and exp-sum passes over [N, V]."""
    module = native.for_rows(logits)
    if module is None:
        scaled = logits.double() / temperature.to(logits.device, torch.float64).unsqueeze(-1)
        return torch.logsumexp(scaled, dim=-1)
    num_rows, vocab = logits.shape
    inverse = (1.0 / temperature.double()).contiguous()  # [N]
    maxima = block_maxima.lookup_rows(logits)  # [N, nb] or None
    out = torch.empty(num_rows, dtype=torch.float64)
    module.log_normalizers(
        logits.data_ptr(),
        logits.stride(0),
        num_rows,
        vocab,
        inverse.data_ptr(),
        0 if maxima is None else maxima.data_ptr(),
        0 if maxima is None else maxima.stride(0),
        out.data_ptr(),
    )
    return out


def _check_process_args(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    num_rows = logits.shape[0]
    for name, t in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if tuple(t.shape) != (num_rows,):
            raise ValueError(f"{name} must be [N={num_rows}], got shape {tuple(t.shape)}")
    if top_k.dtype.is_floating_point:
        raise ValueError(f"top_k must be an integer tensor, got {top_k.dtype}")
