"""The Gumbel field's race as one Triton kernel, for GPUs: every entry of the field drawn, one
program per (key, superblock), a partial maximum each; `gumbel_triton.py` launches it and
takes the best superblock.

On a GPU the torch search (gumbel_field.py) costs its ~150 small tensor ops per call, each a
kernel launch: with a few calls a round that was most of a sampled round's time outside the
forward passes. Drawing all V entries is cheap for a GPU (about 10^7 hashes and logs a round),
so this kernel does not search: each program draws its superblock's maximum and where it sits,
its blocks' maxima, then every entry of its SUPER x BLOCK tile, the same numbers in the same
order of operations as `gumbel_field.dense_field`, adds them (times the noise scale) to the
scores and keeps the tile's best value and its first token.

Importing this module imports triton; `gumbel_triton.py` guards that import.
"""

import triton
import triton.language as tl

_MUL1 = tl.constexpr(0xBF58476D1CE4E5B9)
_MUL2 = tl.constexpr(0x94D049BB133111EB)
_GAMMA = tl.constexpr(0x9E3779B97F4A7C15)
_SUPER_SALT = tl.constexpr(0x3C6EF372FE94F82B)
_ARGMAX_SALT = tl.constexpr(0x6A09E667F3BCC909)
_ENTRY_SALT = tl.constexpr(0xBB67AE8584CAA73B)
_UNIT = tl.constexpr(2.0**-53)


@triton.jit
def _mix64(z):
    """SplitMix64's finaliser on uint64 words (products wrap modulo 2^64)."""
    z = (z ^ (z >> 30)) * _MUL1
    z = (z ^ (z >> 27)) * _MUL2
    return z ^ (z >> 31)


@triton.jit
def _uniform(words):
    """uint64 words -> float64 uniforms in (0, 1) from their top 53 bits."""
    return ((words >> 11).to(tl.float64) + 0.5) * _UNIT


@triton.jit
def _uniform_index(words, sizes):
    """A place uniform in [0, n) from each word (salted), as gumbel_field._uniform_index."""
    at = (_uniform(_mix64(words ^ _ARGMAX_SALT)) * sizes.to(tl.float64)).to(tl.int64)
    return tl.minimum(at, sizes - 1)


@triton.jit
def gumbel_race_kernel(
    scores_ptr,  # [R, V] float32 logits, or probabilities when ARE_PROBS
    row_stride,
    rows_ptr,  # [N] int64 the row of scores each key races over
    keys_ptr,  # [N] int64 field keys
    scale_ptr,  # [N] float64 noise scale (read when HAS_SCALE)
    best_value_ptr,  # [N, NS] float64 out: each superblock's best value
    best_token_ptr,  # [N, NS] int64 out: and its first token (-1: none finite)
    V,
    NUM_BLOCKS,
    NUM_SUPER,
    ARE_PROBS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    SUPER: tl.constexpr,
    BLOCK: tl.constexpr,
):
    n = tl.program_id(0)
    s = tl.program_id(1)
    key = tl.load(keys_ptr + n).to(tl.uint64, bitcast=True)
    row = tl.load(rows_ptr + n)
    s64 = s.to(tl.int64)
    # the superblock: its size, the largest noise M_s in it and the token t_s holding it
    super_size = tl.minimum(SUPER * BLOCK, V - s64 * SUPER * BLOCK)
    super_word = _mix64((key ^ _SUPER_SALT) + (s64 + 1).to(tl.uint64) * _GAMMA)
    super_max = tl.log(super_size.to(tl.float64)) - tl.log(-tl.log(_uniform(super_word)))
    top = _uniform_index(super_word, super_size)
    top_block = s64 * SUPER + top // BLOCK
    # [SUPER] its blocks: sizes, words, maxima M_b and where they sit a_b
    blocks = s64 * SUPER + tl.arange(0, SUPER).to(tl.int64)
    sizes = tl.minimum(tl.maximum(V - blocks * BLOCK, 0), BLOCK)
    words = _mix64(key + (blocks + 1).to(tl.uint64) * _GAMMA)
    n_b = sizes.to(tl.float64)
    truncated = tl.log(n_b) - tl.log(n_b * tl.exp(-super_max) + -tl.log(_uniform(words)))
    on_top = blocks == top_block
    block_max = tl.where(on_top, super_max, tl.minimum(truncated, super_max))
    block_at = tl.where(on_top, top % BLOCK, _uniform_index(words, tl.maximum(sizes, 1)))
    # [SUPER, BLOCK] every entry: a Gumbel truncated below M_b, M_b itself at a_b
    j = tl.arange(0, BLOCK).to(tl.int64)[None, :]
    entry = _mix64((words[:, None] ^ _ENTRY_SALT) + (j + 1).to(tl.uint64) * _GAMMA)
    exponential = -tl.log(_uniform(entry))
    noise = -tl.log(tl.exp(-block_max[:, None]) + exponential)
    noise = tl.where(j == block_at[:, None], block_max[:, None], noise)
    valid = (j < sizes[:, None]) & (blocks[:, None] < NUM_BLOCKS)
    tokens = blocks[:, None] * BLOCK + j  # [SUPER, BLOCK]
    raw = tl.load(scores_ptr + row * row_stride + tokens, mask=valid, other=0.0)
    score = raw.to(tl.float64)
    if ARE_PROBS:
        score = tl.log(score)  # a zero probability: -inf, never picked
    if HAS_SCALE:
        noise = tl.load(scale_ptr + n) * noise
    value = tl.where(valid, score + noise, float("-inf"))
    best = tl.max(tl.max(value, axis=1), axis=0)
    # the first token holding it (the dense argmax's rule); none when nothing is finite
    first = tl.min(tl.min(tl.where(value == best, tokens, V), axis=1), axis=0)
    first = tl.where(best > float("-inf"), first, -1)
    tl.store(best_value_ptr + n * NUM_SUPER + s, best)
    tl.store(best_token_ptr + n * NUM_SUPER + s, first)
