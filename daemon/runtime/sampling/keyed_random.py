"""Draft randomness owned by the proposer, keyed by position.

The random choice a draft makes at absolute position p of request r is a pure function of
(r's draft seed, p): the p-th output of a SplitMix64 stream started at the seed (a
counter-based generator: no state is consumed, so nothing depends on how many draws happened
before, on which process draws, or on whether a draft was prepared ahead or drafted afresh).
A prepared branch and a fresh draft of the same prefix therefore pick the same token, and a
seeded request gives the same output with a fixed k whether its drafts came from a proposer
in this process, a remote one, a prepared branch or a fresh call.

Why this stays lossless. Speculative sampling needs each draft token the verifier examines to
be a fresh sample from the proposal q, independent of everything the verifier has seen so far.
The draft at position p is drawn with u_p = H(seed, p), and u_p is looked at by the verifier at
most once: a round examines the drafts at positions n .. n + a (a accepted, the next rejected or
the bonus drawn), and then commits tokens at exactly those positions, so no later round drafts
at them again. The positions a round drafted but did not examine (after the first rejection)
are reused by the next round, which is sound because the verdict is a function of the examined
drafts and the verifier's own randomness only: conditioned on every verdict so far, the values
u_p at positions never examined are still independent uniforms. (Pre-drafted branches read
only such positions: a branch after the correction at n + a drafts at n + a + 1 and beyond.)
As with any seeded generator, "independent uniform" means the usual pseudo-randomness of the
stream; unseeded requests get a fresh random 63-bit draft seed.

The verifier's own randomness (accept tests, corrections) stays the request's
`torch.Generator` (see `random.py`); a sampled row's bonus token is the Gumbel-max of the
position's field (gumbel_field.py, coupled_bonus.py), which the drafter shares to guess it.
"""

import random

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment (2^64 / golden ratio, odd)
DRAFT_SEED_SALT = 0xD6E8FEB86659FD93  # separates a request's draft stream from its own seed
MAX_SEED = (1 << 63) - 1
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # SplitMix64's finaliser's multipliers


def mix64(value: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit integers with full avalanche."""
    z = value & MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def keyed_u64(seed: int, position: int) -> int:
    """The 64-bit random word of (seed, position): output number `position` of SplitMix64
    started at `seed`."""
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    return mix64(seed + (position + 1) * GOLDEN_GAMMA)


def keyed_draw(seed: int, position: int, num_bits: int) -> int:
    """A uniform integer in [0, 2**num_bits) for (seed, position): the word's top bits, so
    every value is exactly equally likely (2**64 is a multiple of 2**num_bits)."""
    if not 1 <= num_bits <= 64:
        raise ValueError(f"num_bits must be in [1, 64], got {num_bits}")
    return keyed_u64(seed, position) >> (64 - num_bits)


def draft_seed_for(request_seed: int | None) -> int:
    """A request's draft seed: derived from its seed (reproducible), else random."""
    if request_seed is None:
        return random.SystemRandom().getrandbits(63)
    return mix64(request_seed ^ DRAFT_SEED_SALT) & MAX_SEED
