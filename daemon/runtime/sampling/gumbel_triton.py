"""Launching the Triton Gumbel race (gumbel_kernel.py): the field's argmax on a GPU in one
kernel and a reduction over superblocks, instead of the torch search's ~150 launches.

`gumbel_field._search` calls `gumbel_race_triton` for CUDA scores when triton imports. On a
CPU the kernel runs only under TRITON_INTERPRET=1, set before this module is first imported
(the tests do that in a fresh process, as for the rejection kernel).
"""

import torch

try:
    from daemon.runtime.sampling.gumbel_kernel import gumbel_race_kernel

    HAS_TRITON = True
except ImportError:  # triton is optional off Linux/CUDA
    HAS_TRITON = False


def gumbel_race_triton(
    scores: torch.Tensor,  # [R, V] float32
    rows: torch.Tensor,  # [N] int64 on the scores' device
    keys: torch.Tensor,  # [N] int64 on the scores' device
    are_probs: bool,
    noise_scale: torch.Tensor | None,  # [N] on the scores' device
    block: int,
    super_blocks: int,
) -> torch.Tensor:
    """argmax_i (scores[rows[n], i] + scale_n G_i) per key n over the field of the block and
    superblock sizes given [N] int64; -1 where every score is -inf (log p for probabilities)."""
    if not HAS_TRITON:
        raise RuntimeError("triton is not installed; the torch search runs instead")
    if scores.dim() != 2 or scores.stride(-1) != 1:
        raise ValueError(f"scores must be [R, V] with unit stride in V, got {tuple(scores.shape)}")
    num_keys = keys.shape[0]
    vocab_size = scores.shape[-1]
    num_blocks = -(-vocab_size // block)
    num_super = -(-num_blocks // super_blocks)
    device = scores.device
    best_value = torch.empty(num_keys, num_super, dtype=torch.float64, device=device)
    best_token = torch.empty(num_keys, num_super, dtype=torch.int64, device=device)
    if num_keys == 0:
        return torch.empty(0, dtype=torch.int64, device=device)
    scale = best_value if noise_scale is None else noise_scale.to(torch.float64).contiguous()
    gumbel_race_kernel[(num_keys, num_super)](
        scores, scores.stride(0), rows.contiguous(), keys.contiguous(), scale,
        best_value, best_token, vocab_size, num_blocks, num_super,
        ARE_PROBS=are_probs, HAS_SCALE=noise_scale is not None,
        SUPER=super_blocks, BLOCK=block,
    )  # fmt: skip
    # [N] the best superblock (the first on ties: lower tokens, the dense argmax's rule)
    best = best_value.argmax(dim=-1, keepdim=True)
    return best_token.gather(-1, best).squeeze(-1)
