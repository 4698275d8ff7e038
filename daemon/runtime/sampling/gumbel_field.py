"""A Gumbel noise field keyed by (seed, position, token), and its exact argmax over a real
vocabulary without drawing noise for every token.

Gumbel-max: with G_i i.i.d. Gumbel(0), argmax_i (log p_i + G_i) is an exact sample from p. Two
parties that share the noise G of a position and maximise against their own distributions
pick the same token far more often than independent samples would (a coupling without
communication): the drafter picks argmax (log q + G), the verifier argmax (log p + G), and with
q = p they always agree. The speculative sampler uses it for the tokens a draft's proposal
does not list (see rejection.py and proposers/draft_sampling.py).

The field of one key (a 64-bit word per (seed, position), `field_key`) is defined top down, so
that its maximum can be found by drawing a few hundred numbers instead of V. Tokens are cut into
blocks of BLOCK consecutive ids (the last one shorter when V is not a multiple), and blocks into
superblocks of SUPER blocks (the last one with what is left):
  * superblock s of n_s tokens, from its word W_s = mix((key ^ SUPER_SALT) + (s + 1) * gamma):
    its largest noise M_s = log(n_s) + Gumbel(0) (the maximum of n_s Gumbel(0)), and where it
    sits, a token t_s uniform in [0, n_s), which names its block and the place in it;
  * block b of n_b tokens in s, from its word w_b = mix(key + (b + 1) * gamma): the block that
    holds t_s has M_b = M_s; every other one M_b = log(n_b) - log(n_b exp(-M_s) + E_b), E_b ~
    Exp(1) from w_b: the maximum of n_b Gumbel(0) truncated below M_s, which is what the other
    blocks' maxima are given the superblock's. Where M_b sits, a_b, is t_s's place in the top
    block, else uniform in [0, n_b) from mix(w_b ^ ARGMAX_SALT);
  * every other entry j of block b is -log(exp(-M_b) + E_j), E_j ~ Exp(1) from
    mix(w_b ^ ENTRY_SALT + (j + 1) * gamma): a Gumbel(0) truncated below M_b.
So the entries are i.i.d. Gumbel(0), and nothing in a block (superblock) exceeds its M: its
largest score plus scale * M bounds everything in it. `gumbel_argmax` takes the block maxima of
the scores (one pass, no transcendental functions; the LM head and the C softmax leave them)
and searches best first: the C search (_cpu_kernels.c) draws the superblocks' maxima, opens
those whose bound beats the best value found (drawing the maxima of their blocks whose largest
score could still win), and looks into a block only while its bound beats that value, at the
entries whose score can. Nothing else can hold the maximum, so the result equals the argmax
over the dense field (`dense_field`, the tests' reference). Over Qwen's 151,936 tokens a key
draws 75 superblock maxima and a few hundred block maxima where the old one-level field drew
all 2,374. Most of those few hundred cannot win either: whether a block's (an entry's) noise
could lift its score past the value is first bounded without a log (E = -log u >= 1 - u, and
exp bounded by powers of two), and only the few it does not rule out have their logs taken
(4 of ~270 a key at T = 0.7 over a random model's logits). On a GPU one Triton kernel draws
every entry instead (gumbel_kernel.py): cheaper there than the searches' many small steps.
The torch search (other devices, NaN, no triton) draws every block's maximum at once, a few
tensor ops, then looks into the blocks that can win.

Everything is integer arithmetic on int64 tensors (SplitMix64's finaliser, products wrapping
modulo 2^64, logical shifts by masking) and float64 logs: the same numbers on any device.
"""

import contextlib
import math

import torch

from daemon.runtime.device import triton_enabled
from daemon.runtime.host_tensors import host_int64, int64_tensor
from daemon.runtime.model import native
from daemon.runtime.sampling import block_maxima
from daemon.runtime.sampling.keyed_random import GOLDEN_GAMMA, MASK64, MIX1, MIX2, mix64

BLOCK = 64  # tokens per block of the field
SUPER = 32  # blocks per superblock (2,048 tokens)
SUPER_SALT = 0x3C6EF372FE94F82B  # the key -> its superblocks' words
FIELD_SALT = 0x2545F4914F6CDD1D  # separates the field's keys from every other keyed stream
ARGMAX_SALT = 0x6A09E667F3BCC909  # the block word -> where the block's maximum sits
ENTRY_SALT = 0xBB67AE8584CAA73B  # the block word -> its other entries
_UNIT = 2.0**-53
NOT_SEARCHED = -3  # gumbel_argmax with runs: a key past its run's first miss (the C search's)


def _signed(value: int) -> int:
    """A 64-bit word as the int64 that holds the same bits."""
    value &= MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_MUL1 = _signed(MIX1)
_MUL2 = _signed(MIX2)
_GAMMA = _signed(GOLDEN_GAMMA)
_ARGMAX_SALT = _signed(ARGMAX_SALT)
_ENTRY_SALT = _signed(ENTRY_SALT)
_SUPER_SALT = _signed(SUPER_SALT)


def field_key(seed: int, position: int) -> int:
    """The field's key (an int64 value) for the token at absolute `position` of a request
    whose draft seed is `seed`."""
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    return _signed(mix64((seed ^ FIELD_SALT) + (position + 1) * GOLDEN_GAMMA))


def field_keys(seeds: list[int], positions: list[int]) -> torch.Tensor:
    """[N] int64 keys, one per (seed, position) pair."""
    if len(seeds) != len(positions):
        raise ValueError(f"{len(seeds)} seeds for {len(positions)} positions")
    return field_key_runs(seeds, positions, [1] * len(seeds))


def field_key_runs(seeds: list[int], starts: list[int], counts: list[int]) -> torch.Tensor:
    """[sum(counts)] int64: `field_key_run(seeds[j], starts[j], counts[j])` for each j, one
    after another (a verify pass's keys: each sequence's draft positions). In C where the
    native kernels run (a few us for a round's keys, ~0.7 us a key in Python)."""
    if any(c < 0 for c in counts):
        raise ValueError(f"counts must be >= 0, got {counts}")
    module = native.kernels() if native.enabled() else None
    if module is None:
        keys: list[int] = []
        for seed, start, count in zip(seeds, starts, counts, strict=True):
            keys += field_key_run(seed, start, count)
        return int64_tensor(keys)
    out = torch.empty(sum(counts), dtype=torch.int64)
    module.field_key_runs(seeds, starts, counts, out.data_ptr())
    return out


def field_key_run(seed: int, position: int, count: int) -> list[int]:
    """`field_key(seed, position + j)` for j < count: a sequence's keys at consecutive
    positions (a verify pass needs one for each draft of each sequence), mix64 inlined."""
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    keys = []
    word = (seed ^ FIELD_SALT) + (position + 1) * GOLDEN_GAMMA
    for _ in range(count):
        z = word & MASK64
        z = ((z ^ (z >> 30)) * MIX1) & MASK64
        z = ((z ^ (z >> 27)) * MIX2) & MASK64
        z ^= z >> 31
        keys.append(z - (1 << 64) if z >> 63 else z)
        word += GOLDEN_GAMMA
    return keys


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 words (torch's >> is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def mix64_t(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 tensors: the same bits as `keyed_random.mix64`."""
    z = (z ^ _shift_right(z, 30)) * _MUL1
    z = (z ^ _shift_right(z, 27)) * _MUL2
    return z ^ _shift_right(z, 31)


def _uniform(words: torch.Tensor) -> torch.Tensor:
    """int64 words -> float64 uniforms in (0, 1) from their top 53 bits (never 0 or 1)."""
    return (_shift_right(words, 11).double() + 0.5) * _UNIT


def _block_sizes(vocab_size: int, device: torch.device) -> torch.Tensor:
    """[nb] tokens per block: BLOCK, the last one what is left."""
    num_blocks = -(-vocab_size // BLOCK)
    sizes = torch.full((num_blocks,), BLOCK, dtype=torch.int64, device=device)
    sizes[-1] = vocab_size - (num_blocks - 1) * BLOCK
    return sizes


def _block_words(keys: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """keys [...] int64, blocks [...] int64 (broadcast) -> the blocks' words."""
    return mix64_t(keys + (blocks + 1) * _GAMMA)


def _block_noise_maxima(
    keys: torch.Tensor,  # [N] int64
    words: torch.Tensor,  # [N, nb] int64 the block words
    sizes: torch.Tensor,  # [nb] int64 tokens per block
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per key and block: M_b, the block's largest noise [N, nb] float64, and a_b, where it sits
    [N, nb] int64, drawn top down from the superblocks (the module's docstring)."""
    device = words.device
    num_blocks = sizes.shape[0]
    blocks = torch.arange(num_blocks, device=device)  # [nb]
    owner = blocks // SUPER  # [nb] each block's superblock
    num_super = -(-num_blocks // SUPER)
    super_sizes = torch.zeros(num_super, dtype=torch.int64, device=device)
    super_sizes.index_add_(0, owner, sizes)  # [ns] tokens per superblock
    super_ids = torch.arange(num_super, device=device)
    super_words = mix64_t((keys.unsqueeze(-1) ^ _SUPER_SALT) + (super_ids + 1) * _GAMMA)
    super_max = super_sizes.double().log() - (-_uniform(super_words).log()).log()  # [N, ns]
    top = _uniform_index(super_words, super_sizes)  # [N, ns] token of the maximum
    top_block = super_ids * SUPER + top // BLOCK  # [N, ns]
    on_top = blocks == top_block[:, owner]  # [N, nb]
    limit = super_max[:, owner]  # [N, nb]
    n = sizes.double()
    truncated = n.log() - (n * torch.exp(-limit) + (-_uniform(words).log())).log()
    block_max = torch.where(on_top, limit, torch.minimum(truncated, limit))
    block_at = torch.where(on_top, (top % BLOCK)[:, owner], _uniform_index(words, sizes))
    return block_max, block_at


def _uniform_index(words: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """A place uniform in [0, n) from each word (salted: the word's own uniform is in use)."""
    at = (_uniform(mix64_t(words ^ _ARGMAX_SALT)) * sizes.double()).long()
    return torch.minimum(at, sizes - 1)


def _entry_noise(
    words: torch.Tensor,  # [...] int64 block words
    block_max: torch.Tensor,  # [...] float64 their largest noise M_b
    block_at: torch.Tensor,  # [...] int64 where it sits, a_b
    sizes: torch.Tensor,  # [...] int64 tokens in those blocks
    j: torch.Tensor,  # [...] int64 entries within them (broadcast with the others)
) -> torch.Tensor:
    """The field's entries float64 at index j of blocks (words, sizes); -inf past n_b."""
    entry = mix64_t((words ^ _ENTRY_SALT) + (j + 1) * _GAMMA)
    exponential = -_uniform(entry).log()  # Exp(1)
    noise = -(torch.exp(-block_max) + exponential).log()  # a Gumbel truncated below M_b
    noise = torch.where(j == block_at, block_max, noise)
    return noise.masked_fill(j >= sizes, -math.inf)


def _expand(
    words: torch.Tensor,  # [P] int64 block words
    block_max: torch.Tensor,  # [P] float64 their largest noise
    block_at: torch.Tensor,  # [P] int64 where it sits
    sizes: torch.Tensor,  # [P] int64 tokens in each block
) -> torch.Tensor:
    """The field's entries [P, BLOCK] float64 of P blocks (entries past n_b are -inf)."""
    j = torch.arange(BLOCK, device=words.device)  # [BLOCK]
    return _entry_noise(
        words.unsqueeze(-1), block_max.unsqueeze(-1), block_at.unsqueeze(-1),
        sizes.unsqueeze(-1), j,
    )  # fmt: skip


def dense_field(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The whole field [N, V] float64 of keys [N]: every entry drawn (the reference)."""
    num_rows = keys.shape[0]
    sizes = _block_sizes(vocab_size, keys.device)  # [nb]
    num_blocks = sizes.shape[0]
    words, block_max, block_at, _ = _block_noise(keys, sizes, None)  # [N, nb] each
    noise = _expand(
        words.reshape(-1), block_max.reshape(-1), block_at.reshape(-1), sizes.repeat(num_rows)
    )  # [N * nb, BLOCK]
    return noise.view(num_rows, num_blocks * BLOCK)[:, :vocab_size]


def gumbel_argmax(
    scores: torch.Tensor,  # [R, V] float32 (left as it was)
    keys: torch.Tensor,  # [N] int64 field keys
    excluded: torch.Tensor | None = None,  # [N, S] int64 token ids, entries < 0 unused
    are_probs: bool = False,
    rows: torch.Tensor | None = None,  # [N] int64 the row of `scores` each key maximises
    noise_scale: torch.Tensor | None = None,  # [N] float > 0 (raw scores only)
    hints: torch.Tensor | None = None,  # [N] int64 a token likely to win per key, < 0: none
    runs: list[int] | None = None,  # lengths of runs of consecutive keys (with hints)
) -> torch.Tensor:
    """argmax_i (scores_i + G_i) per key, over the tokens its row does not exclude, [N] int64;
    -1 where no token is left (every score -inf). `are_probs`: the scores are probabilities,
    and log p is maximised (a zero probability is never picked). `rows` (distinct) picks the
    rows of a larger tensor without copying it; default: row n for key n. `noise_scale` s:
    argmax_i (scores_i + s G_i), the same token as argmax_i (scores_i / s + G_i): logits at
    temperature s without dividing them. `hints` (the verifier passes the drafts): the C
    search offers that token's value first, which prunes the rest as hard as the answer
    does where the hint is the answer; the answer is the same either way. `runs` (with
    hints; their lengths sum to N): the keys come in runs, a sequence's draft positions then
    its bonus, and after a key whose answer is not its hint the rest of its run is not needed:
    the C search leaves those NOT_SEARCHED (a verifier accepts drafts up to the first that is
    not its choice and reads nothing after it); other searches answer them anyway. Excluded entries
    are masked for the search and restored."""
    if noise_scale is not None and are_probs:
        raise ValueError("noise_scale applies to raw scores (logits), not probabilities")
    # callers build keys, rows and masks on the host; the scores may be on a GPU
    if scores.device.type != "cpu":
        keys = keys.to(scores.device)
        excluded, rows, noise_scale = (_on(scores, t) for t in (excluded, rows, noise_scale))
    num_keys = keys.shape[0]
    if rows is None and scores.shape[0] != num_keys:
        raise ValueError(f"{num_keys} keys for {scores.shape[0]} rows of scores")
    if excluded is None or not excluded.numel():
        return _search(scores, rows, keys, are_probs, noise_scale, hints, runs)
    if excluded.dim() != 2 or excluded.shape[0] != num_keys:
        raise ValueError(f"excluded must be [N={num_keys}, S], got {tuple(excluded.shape)}")
    if scores.is_contiguous():  # the C search masks and restores each key's tokens itself
        found = _native_search(scores, rows, keys, are_probs, noise_scale, hints, runs, excluded)
        if found is not None:
            return found
    if rows is None:
        rows = torch.arange(num_keys, device=scores.device)
    if not scores.is_contiguous():  # masking in place needs rows that own their memory
        scores = scores.contiguous()
    key_index, entry = (excluded >= 0).nonzero(as_tuple=True)
    at_rows, at_tokens = rows[key_index], excluded[key_index, entry]
    # scores made under inference mode may only be updated in place under it
    needs_mode = scores.is_inference() and not torch.is_inference_mode_enabled()
    with torch.inference_mode() if needs_mode else contextlib.nullcontext():
        saved = scores[at_rows, at_tokens]
        scores[at_rows, at_tokens] = _fill(are_probs)
        try:
            return _search(scores, rows, keys, are_probs, noise_scale, hints, runs)
        finally:
            scores[at_rows, at_tokens] = saved


def gumbel_topk(
    scores: torch.Tensor,  # [N, V] float32 raw scores (logits), left as they were
    keys: torch.Tensor,  # [N] int64 field keys
    num: int,
    noise_scale: torch.Tensor | None = None,  # [N] float > 0
) -> torch.Tensor:
    """The `num` tokens with the largest scores_i + s G_i per key, best first, [N, num] int64
    (-1 past the tokens with a finite score): the first is `gumbel_argmax`'s token, the
    others the runners-up of the same race. One search: the num blocks with the best bounds,
    then the entries of every other block that could beat the num-th best value found there."""
    num_keys, vocab_size = scores.shape
    if keys.shape[0] != num_keys:
        raise ValueError(f"{keys.shape[0]} keys for {num_keys} rows of scores")
    keys, noise_scale = keys.to(scores.device), _on(scores, noise_scale)
    if not 1 <= num <= vocab_size:
        raise ValueError(f"num must be in [1, vocab_size={vocab_size}], got {num}")
    device = scores.device
    sizes = _block_sizes(vocab_size, device)  # [nb]
    num_blocks = sizes.shape[0]
    rows = torch.arange(num_keys, device=device)
    words, block_max, block_at, scale = _block_noise(keys, sizes, noise_scale)
    bound = _block_maxima(scores).double() + scale * block_max  # [N, nb]
    # the blocks with the best bounds first (as many as tokens asked): they usually hold the
    # answer, and the num-th best value among them prunes the other blocks hard
    num_first = min(num, num_blocks)
    first = bound.topk(num_first, dim=-1).indices  # [N, F]
    first_rows = rows.repeat_interleave(num_first)  # [N * F]
    first_blocks = first.flatten()  # [N * F]
    in_first = _as_scores(_score_blocks(scores, first_rows, first_blocks, False), False)
    first_noise = _expand(
        words[first_rows, first_blocks], block_max[first_rows, first_blocks],
        block_at[first_rows, first_blocks], sizes[first_blocks],
    )  # fmt: skip
    # first_noise: [N * F, BLOCK]
    # [N, F * BLOCK] candidates per key, and their tokens
    values = (in_first + scale[first_rows] * first_noise).view(num_keys, -1)
    tokens = (first_blocks.unsqueeze(-1) * BLOCK + torch.arange(BLOCK, device=device)).view(
        num_keys, -1
    )
    # the num-th best so far [N] (F blocks hold at least num entries: num <= V <= nb * BLOCK)
    kth = values.topk(num, dim=-1).values[:, -1]
    # then the entries of other blocks that could still beat it
    rest = bound > kth.unsqueeze(-1)  # [N, nb]
    rest.scatter_(1, first, False)
    key_index, blocks = rest.nonzero(as_tuple=True)  # [P]
    if key_index.numel():
        in_blocks = _score_blocks(scores, key_index, blocks, False)  # [P, BLOCK]
        scale_p = scale[key_index, 0]  # [P]
        threshold = _lowered(kth[key_index] - scale_p * block_max[key_index, blocks], False)
        pair, j = (in_blocks > threshold.unsqueeze(-1)).nonzero(as_tuple=True)  # [E]
        if pair.numel():
            owner, entry_blocks = key_index[pair], blocks[pair]  # [E] owner ascending
            noise = _entry_noise(
                words[owner, entry_blocks], block_max[owner, entry_blocks],
                block_at[owner, entry_blocks], sizes[entry_blocks], j,
            )  # fmt: skip
            entry_values = _as_scores(in_blocks[pair, j], False) + scale[owner, 0] * noise
            # each entry's column: its rank among its key's entries (nonzero keeps them in
            # key order), after the first block's
            counts = torch.bincount(owner, minlength=num_keys)  # [N]
            starts = counts.cumsum(0) - counts  # [N]
            column = torch.arange(owner.shape[0], device=device) - starts[owner]  # [E]
            width = int(counts.max())
            more_values = torch.full(
                (num_keys, width), -math.inf, dtype=torch.float64, device=device
            )  # [N, W]
            more_tokens = torch.full((num_keys, width), -1, dtype=torch.long, device=device)
            more_values[owner, column] = entry_values
            more_tokens[owner, column] = entry_blocks * BLOCK + j
            values = torch.cat([values, more_values], dim=-1)  # [N, BLOCK + W]
            tokens = torch.cat([tokens, more_tokens], dim=-1)
    # [N, num] the best num of each key, best first
    best, at = values.topk(num, dim=-1)
    return torch.where(best > -math.inf, tokens.gather(-1, at), -1)


def gumbel_argmax_at(
    scores: torch.Tensor,  # [B, P, V] float32 (left as it was)
    seqs: torch.Tensor,  # [E] int64
    positions: torch.Tensor,  # [E] int64 (distinct (seq, position) pairs)
    keys: torch.Tensor,  # [E] int64 field keys
    excluded: torch.Tensor | None = None,  # [E, S] int64 token ids, entries < 0 unused
    are_probs: bool = False,
) -> torch.Tensor:
    """`gumbel_argmax` at the rows scores[seqs, positions], [E] int64: searched in place
    when `scores` is contiguous (its [B * P, V] view), else over a copy of those rows only."""
    num_seqs, num_positions, vocab_size = scores.shape
    if scores.is_contiguous():
        flat = scores.view(num_seqs * num_positions, vocab_size)
        rows = seqs * num_positions + positions
        return gumbel_argmax(flat, keys, excluded, are_probs=are_probs, rows=rows)
    return gumbel_argmax(scores[seqs, positions], keys, excluded, are_probs=are_probs)


def _on(scores: torch.Tensor, tensor: torch.Tensor | None) -> torch.Tensor | None:
    """An optional argument on the scores' device."""
    return None if tensor is None else tensor.to(scores.device)


def _fill(are_probs: bool) -> float:
    """The score that never wins: probability 0, logit -inf."""
    return 0.0 if are_probs else -math.inf


def _search(
    scores: torch.Tensor,  # [R, V]
    rows: torch.Tensor | None,  # [N], None: row n for key n
    keys: torch.Tensor,  # [N]
    are_probs: bool,
    noise_scale: torch.Tensor | None,  # [N]
    hints: torch.Tensor | None,  # [N]
    runs: list[int] | None = None,
) -> torch.Tensor:
    found = _native_search(scores, rows, keys, are_probs, noise_scale, hints, runs)
    if found is not None:
        return found
    num_keys = keys.shape[0]
    vocab_size = scores.shape[-1]
    device = scores.device
    if rows is None:
        rows = torch.arange(num_keys, device=device)
    found = _triton_search(scores, rows, keys, are_probs, noise_scale)
    if found is not None:
        return found
    sizes = _block_sizes(vocab_size, device)  # [nb]
    known = block_maxima.lookup(scores) if BLOCK == block_maxima.BLOCK else None
    if known is not None:  # the LM head's (upper bounds while excluded tokens are masked)
        block_best = known[rows]  # [N, nb]
    elif 2 * num_keys < scores.shape[0]:  # a few rows of many: copy them first
        block_best = _block_maxima(scores[rows])  # [N, nb]
    else:
        block_best = _block_maxima(scores)[rows]
    # float64, as the entries' values are: a bound rounded below them could prune a winner
    block_best = block_best.double()
    if are_probs:
        block_best = block_best.log_()
    words, block_max, block_at, scale = _block_noise(keys, sizes, noise_scale)
    bound = block_best + scale * block_max  # [N, nb] no entry of the block exceeds it
    # the block with the best bound first: its maximum is usually the answer
    all_keys = torch.arange(num_keys, device=device)
    first = bound.argmax(dim=-1)  # [N]
    in_first = _as_scores(_score_blocks(scores, rows, first, are_probs), are_probs)  # [N, BL]
    first_noise = _expand(
        words[all_keys, first], block_max[all_keys, first], block_at[all_keys, first],
        sizes[first],
    )  # fmt: skip
    values, at = (in_first + scale * first_noise).max(dim=-1)
    tokens = first * BLOCK + at  # [N]
    # then every entry of another block that could still beat it: a block's entries are at
    # most M_b, so only those whose score exceeds (best - M_b) can; only theirs is drawn
    rest = bound > values.unsqueeze(-1)  # [N, nb]
    rest[all_keys, first] = False
    key_index, blocks = rest.nonzero(as_tuple=True)  # [P]
    if not key_index.numel():
        return torch.where(values > -math.inf, tokens, -1)
    in_blocks = _score_blocks(scores, rows[key_index], blocks, are_probs)  # [P, BLOCK] raw
    scale_p = scale[key_index, 0]  # [P]
    threshold = _lowered(
        values[key_index] - scale_p * block_max[key_index, blocks], are_probs
    )  # [P]
    pair, j = (in_blocks > threshold.unsqueeze(-1)).nonzero(as_tuple=True)  # [E]
    if pair.numel():
        entry_keys, entry_blocks = key_index[pair], blocks[pair]
        noise = _entry_noise(
            words[entry_keys, entry_blocks], block_max[entry_keys, entry_blocks],
            block_at[entry_keys, entry_blocks], sizes[entry_blocks], j,
        )  # fmt: skip
        entry_values = _as_scores(in_blocks[pair, j], are_probs) + scale[entry_keys, 0] * noise
        candidates = torch.cat([values, entry_values])
        candidate_tokens = torch.cat([tokens, entry_blocks * BLOCK + j])
        owners = torch.cat([all_keys, entry_keys])
        values = values.scatter_reduce(0, owners, candidates, reduce="amax")
        wins = candidates == values[owners]
        tokens = tokens.clone()
        tokens[owners[wins]] = candidate_tokens[wins]
    return torch.where(values > -math.inf, tokens, -1)


def _triton_search(
    scores: torch.Tensor,  # [R, V]
    rows: torch.Tensor,  # [N]
    keys: torch.Tensor,  # [N]
    are_probs: bool,
    noise_scale: torch.Tensor | None,  # [N]
) -> torch.Tensor | None:
    """The race on a GPU as one Triton kernel that draws every entry (gumbel_kernel.py): a GPU
    draws the whole field faster than it launches the torch search's ~150 small ops. None
    off CUDA, without triton, or for scores that are not float32 with unit stride in V."""
    if scores.device.type != "cuda" or scores.dtype != torch.float32 or scores.stride(-1) != 1:
        return None
    if not triton_enabled():
        return None
    from daemon.runtime.sampling import gumbel_triton  # imports triton: only on a GPU

    if not gumbel_triton.HAS_TRITON:
        return None
    return gumbel_triton.gumbel_race_triton(
        scores, rows.to(torch.int64), keys, are_probs, noise_scale, BLOCK, SUPER
    )


def _native_search(
    scores: torch.Tensor,  # [R, V]
    rows: torch.Tensor | None,  # [N], None: row n for key n
    keys: torch.Tensor,  # [N]
    are_probs: bool,
    noise_scale: torch.Tensor | None,  # [N]
    hints: torch.Tensor | None,  # [N]
    runs: list[int] | None = None,  # (with hints) lengths of runs of keys, see gumbel_argmax
    excluded: torch.Tensor | None = None,  # [N, S] ids key n may not pick (< 0: unused)
) -> torch.Tensor | None:
    """The same search in C (_cpu_kernels.c, one call for every key: the torch search is ~100
    small ops a call), for float32 logits or probabilities on a CPU with the native kernels;
    None where it does not apply or met a NaN (the torch search decides then). Its logs are
    its own and the C library's, so a value can differ from torch's in the last bits: only a
    near tie between two tokens' values, within that, could pick another token (the field
    is still a Gumbel field, and the verifier's pick from it an exact sample)."""
    module = native.for_rows(scores)
    if module is None or BLOCK != block_maxima.BLOCK:
        return None
    num_keys = keys.shape[0]
    # (the C call checks the rows against the scores: an IndexError where one is outside)
    keys = host_int64(keys)
    rows, hints = (None if t is None else host_int64(t) for t in (rows, hints))
    # float32 temperatures are read as such (each as a double: what a conversion gives, without
    # the torch op, ~20 us a call after a forward pass)
    scale = noise_scale
    if scale is not None and (scale.dtype != torch.float32 or not scale.is_contiguous()):
        scale = scale.to(torch.float64).contiguous()
    maxima = block_maxima.lookup_rows(scores)  # [R, nb] (logits or probabilities) or None
    runs_t = int64_tensor(runs) if runs is not None and hints is not None else None
    excluded = None if excluded is None else host_int64(excluded)
    out = torch.empty(num_keys, dtype=torch.int64)
    clean = module.gumbel_argmax(
        scores.data_ptr(),
        scores.stride(0),
        scores.shape[1],
        scores.shape[0],
        _address(rows),
        keys.data_ptr(),
        _address(scale),
        _address(maxima),
        0 if maxima is None else maxima.stride(0),
        num_keys,
        out.data_ptr(),
        are_probs,
        _address(hints),
        scale is not None and scale.dtype == torch.float32,
        _address(runs_t),
        0 if runs_t is None else runs_t.shape[0],
        _address(excluded),
        0 if excluded is None else excluded.shape[1],
    )
    return out if clean else None


def _address(tensor: torch.Tensor | None) -> int:
    """An optional tensor's data address for the C calls, 0 for none."""
    return 0 if tensor is None else tensor.data_ptr()


def _block_noise(
    keys: torch.Tensor,  # [N] int64
    sizes: torch.Tensor,  # [nb] tokens per block
    noise_scale: torch.Tensor | None,  # [N] float > 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per key and block: the block words [N, nb] int64, the block's largest noise M_b
    [N, nb] float64 and where it sits a_b [N, nb] int64; and the noise's scale [N, 1] float64
    (1: none)."""
    device = sizes.device
    num_keys = keys.shape[0]
    words = _block_words(keys.unsqueeze(-1), torch.arange(sizes.shape[0], device=device))
    block_max, block_at = _block_noise_maxima(keys, words, sizes)
    scale = torch.ones(num_keys, 1, dtype=torch.float64, device=device)
    if noise_scale is not None:
        scale = noise_scale.to(device, torch.float64).view(num_keys, 1)
    return words, block_max, block_at, scale


def _score_blocks(
    scores: torch.Tensor,  # [R, V]
    rows: torch.Tensor,  # [P] int64
    blocks: torch.Tensor,  # [P] int64
    are_probs: bool,
) -> torch.Tensor:
    """The scores [P, BLOCK] of P (row, block) pairs as they are; entries past the vocabulary
    never win (0 or -inf). Whole blocks are rows of a [R * nb, BLOCK] view."""
    num_rows, vocab_size = scores.shape
    whole = vocab_size // BLOCK
    if vocab_size == whole * BLOCK and scores.is_contiguous():
        return scores.view(num_rows * whole, BLOCK).index_select(0, rows * whole + blocks)
    out = torch.full((rows.shape[0], BLOCK), _fill(are_probs), device=scores.device)
    is_whole = blocks < whole
    if whole:
        view = scores[:, : whole * BLOCK].view(num_rows, whole, BLOCK)
        out[is_whole] = view[rows[is_whole], blocks[is_whole]]
    if vocab_size % BLOCK and not bool(is_whole.all()):
        out[~is_whole, : vocab_size - whole * BLOCK] = scores[rows[~is_whole], whole * BLOCK :]
    return out


def _as_scores(raw: torch.Tensor, are_probs: bool) -> torch.Tensor:
    """Raw scores -> float64 values to add the noise to (log p for probabilities)."""
    out = raw.double()
    return out.log_() if are_probs else out


def _lowered(threshold: torch.Tensor, are_probs: bool) -> torch.Tensor:
    """A float64 threshold on scores as a float32 a little below it (a probability if
    `are_probs`): comparing raw float32 scores must never drop an entry that could win; a few
    extra candidates cost nothing."""
    if are_probs:
        return (threshold.exp() * (1.0 - 1e-5)).float()
    return (threshold - 1e-5 * threshold.abs().clamp(min=1.0)).float()


def _block_maxima(scores: torch.Tensor) -> torch.Tensor:
    """[N, V] -> [N, nb] the largest score of each block (one pass, a view for whole blocks;
    none where the LM head left them: block_maxima.py)."""
    if BLOCK == block_maxima.BLOCK and (known := block_maxima.lookup(scores)) is not None:
        return known
    num_rows, vocab_size = scores.shape
    whole = vocab_size // BLOCK
    maxima = [scores[:, : whole * BLOCK].reshape(num_rows, whole, BLOCK).amax(dim=-1)]
    if vocab_size % BLOCK:
        maxima.append(scores[:, whole * BLOCK :].amax(dim=-1, keepdim=True))
    return torch.cat(maxima, dim=-1) if len(maxima) > 1 else maxima[0]
