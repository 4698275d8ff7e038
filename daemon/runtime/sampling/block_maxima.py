"""Block maxima of fresh logits, computed by the LM head, read by the samplers.

At a real vocabulary the samplers' first step is a pass over the logits: greedy's argmax
(argmax.py) takes the max of every chunk, the Gumbel race (gumbel_field.py) the max of every
block of 64 tokens. Over a verify pass's [80, 151,936] float32 logits (48 MB, past the
last-level cache) that pass reads them back from memory: ~6 ms on one core, more than the rest
of the round's sampling. The CPU runner's LM head (skinny.logits_with_block_maxima) computes the
same maxima while each block of 64 columns is still in cache and leaves them here; the samplers
take them instead of reading the logits again.

Exactness: the maxima hold for the logits as the LM head wrote them. Whoever writes into logits
in place calls `forget` first; the C in-place softmax (process_logits) takes the
probabilities' block maxima as it writes them and records those instead, so the Gumbel races
over a verify pass's probabilities (rejection.py) read a block only where it can win. The
Gumbel race masks
excluded tokens for the length of one search and restores them: it uses the maxima as upper
bounds only, which those of the unmasked logits still are. The entries hold the
logits tensors themselves, so their memory cannot be reused by another tensor while an entry
lives: a storage address names these logits and nothing else. Inference tensors carry no
version counter, hence the explicit rule. At most SLOTS entries are kept, and the engine
clears them after every step, so they never keep a finished round's logits alive.
"""

import threading

import torch

BLOCK = 64  # logits per block maximum (the Gumbel field's BLOCK, skinny.BMAX_BLOCK)
SLOTS = 2  # the newest LM head outputs kept: a draft step's and a verify pass's

_lock = threading.Lock()
_entries: list[tuple[torch.Tensor, torch.Tensor]] = []  # (logits [R, V], maxima [R, nb])


def remember(logits: torch.Tensor, maxima: torch.Tensor) -> None:
    """Record the maxima [..., ceil(V / BLOCK)] of freshly written logits [..., V] (float32,
    contiguous, owning their whole storage). Anything else is not recorded."""
    vocab = logits.shape[-1]
    num_blocks = -(-vocab // BLOCK)
    if (
        logits.dtype != torch.float32
        or not logits.is_contiguous()
        or logits.storage_offset() != 0
        or logits.untyped_storage().nbytes() != logits.numel() * logits.element_size()
        or maxima.shape != (*logits.shape[:-1], num_blocks)
        or not maxima.is_contiguous()
        or logits.numel() == 0
    ):
        return
    flat = (
        (logits, maxima)
        if logits.dim() == 2
        else (logits.view(-1, vocab), maxima.view(-1, num_blocks))
    )
    with _lock:
        _entries.insert(0, flat)
        del _entries[SLOTS:]


def forget(logits: torch.Tensor) -> None:
    """The logits (or any view of them) are about to be overwritten: drop their maxima."""
    if logits.device.type != "cpu" or logits.numel() == 0:
        return
    ptr = logits.untyped_storage().data_ptr()
    with _lock:
        _entries[:] = [e for e in _entries if e[0].untyped_storage().data_ptr() != ptr]


def clear() -> None:
    with _lock:
        _entries.clear()


def held() -> int:
    """How many logits tensors the entries keep alive."""
    with _lock:
        return len(_entries)


def lookup_rows(scores: torch.Tensor) -> torch.Tensor | None:
    """`lookup`, where the maxima's rows are contiguous (what the C kernels read)."""
    found = lookup(scores)
    return found if found is None or found.stride(-1) == 1 else None


def lookup(scores: torch.Tensor) -> torch.Tensor | None:
    """The block maxima [..., nb] of `scores` [..., V] when they are (a view of whole rows of)
    logits an LM head recorded, else None (the caller computes them)."""
    if scores.device.type != "cpu" or scores.dtype != torch.float32 or scores.numel() == 0:
        return None
    ptr = scores.untyped_storage().data_ptr()
    with _lock:
        found = next((e for e in _entries if e[0].untyped_storage().data_ptr() == ptr), None)
    if found is None:
        return None
    logits, maxima = found  # [R, V], [R, nb]
    if scores is logits:  # the recorded rows themselves (a draft step's logits): no view
        return maxima
    vocab, num_blocks = logits.shape[-1], maxima.shape[-1]
    lead_strides = scores.stride()[:-1]
    offset = scores.storage_offset()
    # whole rows only: the last dimension is a row's every logit, each lead step whole rows
    if scores.shape[-1] != vocab or (scores.stride(-1) != 1 and vocab > 1):
        return None
    if offset % vocab or any(s % vocab for s in lead_strides):
        return None
    # the same rows of the maxima, as a view: row r of the logits is row r of the maxima
    return maxima.as_strided(
        (*scores.shape[:-1], num_blocks),
        (*(s // vocab * num_blocks for s in lead_strides), 1),
        maxima.storage_offset() + offset // vocab * num_blocks,
    )
