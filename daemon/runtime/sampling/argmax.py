"""argmax over the vocabulary, fast on a CPU.

torch's CPU argmax walks a row one element at a time: over [80, 151,936] float32 logits (a
verify pass of 16 sequences, k = 4, at Qwen's vocabulary) it takes ~10 ms on one core, while
`amax` (vectorised) reads the same 48 MB in ~1.3 ms. So on a CPU the row is cut into chunks:
the vectorised max of every chunk, the argmax of those few maxima, then the argmax inside the
winning chunk only. The rule is torch.argmax's: the first index of the maximum (a NaN counts as
the maximum; the first chunk holding the first maximum holds its first index). Other devices
keep torch.argmax, which is already parallel there. Where the LM head left the logits' block
maxima (block_maxima.py), they are the chunk maxima, and the logits are read in the winning
block only.

Where the native kernels run, one C call does it all (argmax_rows): torch's argmax over the
maxima themselves walks them one at a time too (~1.9 ns an element here), and with its small
ops around it the pick from maxima took 150 us at 16 rows of 151,936 (a draft step) and 520 us
at 80 (a verify pass), against 42 and 93 us for the call. In the vocabulary bench (V = 151,936,
B = 16, k = 4, greedy) the time outside the forward passes fell from 4.0 to 2.9 ms a round.
"""

import torch

from daemon.runtime.model import native
from daemon.runtime.sampling import block_maxima

CHUNK = 256  # elements per chunk: the chunk maxima stay small, the winning chunk is one read
MIN_VOCAB = 4 * CHUNK  # narrower rows: torch.argmax directly


def argmax_last(x: torch.Tensor) -> torch.Tensor:
    """[..., V] -> [...] int64: the index of the first maximum along the last dimension."""
    vocab = x.shape[-1]
    if x.device.type != "cpu" or vocab < MIN_VOCAB or x.numel() == 0:
        return x.argmax(dim=-1)
    lead = x.shape[:-1]
    found = _native_argmax(x)
    if found is not None:
        return found.reshape(lead)
    known = block_maxima.lookup(x)  # [..., nb] or None
    if known is not None:
        return _argmax_in_blocks(x, known, block_maxima.BLOCK).reshape(lead)
    rows = x.reshape(-1, vocab)  # [R, V] (a view for contiguous logits)
    num_chunks = vocab // CHUNK
    split = num_chunks * CHUNK
    chunk_max = rows[:, :split].unflatten(1, (num_chunks, CHUNK)).amax(dim=-1)  # [R, n]
    best_chunk = chunk_max.argmax(dim=-1)  # [R]
    offsets = best_chunk.unsqueeze(-1) * CHUNK + torch.arange(CHUNK)  # [R, CHUNK]
    index = best_chunk * CHUNK + rows.gather(1, offsets).argmax(dim=-1)  # [R]
    if split < vocab:  # the ragged tail: it wins only if strictly greater (or the head has no
        # NaN and it does), which torch.argmax's first-maximum rule over [head, tail] gives
        tail = rows[:, split:]  # [R, V - split]
        head_val = chunk_max.gather(1, best_chunk.unsqueeze(-1)).squeeze(-1)  # [R]
        tail_arg = tail.argmax(dim=-1)  # [R]
        tail_val = tail.gather(1, tail_arg.unsqueeze(-1)).squeeze(-1)  # [R]
        tail_wins = torch.stack([head_val, tail_val], dim=-1).argmax(dim=-1).bool()  # [R]
        index = torch.where(tail_wins, split + tail_arg, index)
    return index.reshape(lead)


def _native_argmax(x: torch.Tensor) -> torch.Tensor | None:
    """[R] int64 argmax of x's rows in one C call (through their block maxima where the LM head
    left them), or None where the kernels do not run or x is not rows they read."""
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x  # a view for contiguous logits
    module = native.for_rows(rows)
    if module is None:
        return None
    maxima = block_maxima.lookup_rows(rows)  # [R, nb] or None
    out = torch.empty(rows.shape[0], dtype=torch.int64)
    module.argmax_rows(
        rows.data_ptr(),
        rows.stride(0),
        rows.shape[0],
        rows.shape[1],
        0 if maxima is None else maxima.data_ptr(),
        0 if maxima is None else maxima.stride(0),
        out.data_ptr(),
    )
    return out


def _argmax_in_blocks(
    x: torch.Tensor,  # [..., V]
    maxima: torch.Tensor,  # [..., nb] the max of every `block` entries (the last: what is left)
    block: int,
) -> torch.Tensor:
    """[...] int64 argmax from known block maxima: the first block holding the maximum (or a
    NaN) holds its first index, found by reading that block alone."""
    vocab = x.shape[-1]
    best_block = maxima.argmax(dim=-1, keepdim=True)  # [..., 1]
    # [..., block] the winning block's indices; the last block's past V repeat V - 1, whose
    # value is the block's own, so the first maximum is still found first
    at = (best_block * block + torch.arange(block)).clamp_(max=vocab - 1)
    return best_block.squeeze(-1) * block + x.gather(-1, at).argmax(dim=-1)
