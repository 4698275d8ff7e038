"""Sampling a token from unnormalised weights with one uniform number: the inverse CDF.

Token i is chosen when sum(w[:i]) <= u * sum(w) < sum(w[:i+1]), for u ~ U[0, 1): an exact
sample from w / sum(w) that costs one uniform per row, where the exponential race
(argmax w / E) needs a random number per vocabulary entry: at V = 151,936 and 16 rows that is
2.4 M draws a round, several times the work of the rest of the sampler.

Precision. At large V every weight is small next to the total, so the running sum is kept in
float64 and the uniform is float64 (53 bits): a float32 prefix sum over 151,936 entries drifts
by more than a near-uniform token's own mass. The sum runs in two levels, as in the Triton
kernel: sums of blocks of BLOCK entries, a float64 prefix over the blocks, then a float64
prefix inside the chosen block. Here the block sums themselves are float32 (torch's cascaded
sum: relative error ~1e-7 of one block's mass, ~1e-9 absolute on a flat row at V = 151,936,
a ten-thousandth of one token's mass; the kernel sums in float64), because torch's CPU sum
with a float64 accumulator is scalar, 12x slower than the float32 one over [16, 151,936].
Tokens of weight 0 are never chosen.
"""

import torch

BLOCK = 1024  # vocabulary entries per block of the two-level prefix sum


def sample_inverse_cdf(
    weights: torch.Tensor,  # [N, V] float32, non-negative, each row with a positive entry
    uniform: torch.Tensor,  # [N] float64 in [0, 1)
) -> torch.Tensor:
    """One index [N] int64 per row, drawn with probability weights / row sum."""
    if weights.dim() != 2 or uniform.shape != weights.shape[:1]:
        raise ValueError(
            f"need weights [N, V] and uniform [N], got {tuple(weights.shape)}, "
            f"{tuple(uniform.shape)}"
        )
    num_rows, vocab = weights.shape
    if num_rows == 0:
        return torch.empty(0, dtype=torch.long, device=weights.device)
    num_full = vocab // BLOCK
    acc = torch.float64 if weights.dtype == torch.float64 else torch.float32  # block sums
    # [N, nb] block sums (a partial last block when V is not a multiple of BLOCK)
    parts = []
    if num_full:
        full = weights[:, : num_full * BLOCK].reshape(num_rows, num_full, BLOCK)
        parts.append(full.sum(dim=-1, dtype=acc))
    if vocab % BLOCK:
        parts.append(weights[:, num_full * BLOCK :].sum(dim=-1, keepdim=True, dtype=acc))
    block_ends = torch.cat(parts, dim=-1).to(torch.float64).cumsum(dim=-1)
    num_blocks = block_ends.shape[-1]
    # [N, 1] the point of the CDF this row's token covers
    point = (uniform.to(torch.float64) * block_ends[:, -1]).unsqueeze(-1)
    # [N, 1] first block whose end passes the point
    block = torch.searchsorted(block_ends, point, right=True).clamp(max=num_blocks - 1)
    start = torch.where(block > 0, block_ends.gather(-1, (block - 1).clamp(min=0)), 0.0)
    # [N, BLOCK] the chosen block's weights (zeros past V)
    offsets = block * BLOCK + torch.arange(BLOCK, device=weights.device)
    in_vocab = offsets < vocab
    local = weights.gather(-1, offsets.clamp(max=vocab - 1)).to(torch.float64)
    local = torch.where(in_vocab, local, 0.0)
    ends = start + local.cumsum(dim=-1)  # [N, BLOCK]
    index = (ends <= point).sum(dim=-1, keepdim=True)  # [N, 1] first entry ending past point
    # Rounding between a block's sum and its inner prefix can leave the point just past the
    # block's last entry: take its last positive entry then (a bias of order 1e-16).
    last_positive = (torch.arange(BLOCK, device=weights.device) * (local > 0)).amax(-1, True)
    index = torch.where(index >= BLOCK, last_positive, index)
    return (block * BLOCK + index).squeeze(-1)
