"""Per-request randomness.

Each request owns a `torch.Generator` seeded from its seed, and every random number it consumes
is drawn from that generator alone, in an order that depends only on the request itself (its
number of drafts per round). So a seed reproduces a request's output whatever else shares the
batch. Greedy requests pass `None` and consume nothing: they get filler numbers (0) that the
sampler never reads for greedy rows.

A round draws, per sampled request, one float32 uniform per draft (its accept test) and then
one float64 uniform for the token emitted after the accepted prefix, which is sampled by the
inverse CDF (`inverse_cdf.py`): the work does not grow with the vocabulary.

`sample_sparse` (small supports) uses the exponential race instead: with E_i ~ Exp(1) i.i.d.,
argmax_i p_i / E_i is an exact sample from p (p_i / E_i is the inverse of an Exp(p_i) arrival
time; the first arrival wins with probability p_i / sum p).
"""

import random as _py_random

import torch

UNUSED_UNIFORM = 0.0
UNUSED_EXPONENTIAL = 1.0
# Exp(1) draws are clamped to this so that p / E is never a division by zero.
MIN_EXPONENTIAL = torch.finfo(torch.float32).tiny


def make_generators(
    seeds: list[int | None], device: torch.device | str = "cpu"
) -> list[torch.Generator]:
    """One generator per request; a `None` seed draws a fresh random seed."""
    generators = []
    for seed in seeds:
        if seed is None:
            seed = _py_random.SystemRandom().getrandbits(63)
        generators.append(torch.Generator(device=device).manual_seed(seed))
    return generators


def uniform_noise(
    generators: list[torch.Generator | None], num_draft: list[int], max_k: int
) -> torch.Tensor:
    """U[0, 1) noise [B, max_k] float32 for the accept tests; entries past num_draft[b] are
    unused (filled with UNUSED_UNIFORM, and nothing is drawn for them)."""
    _check_lengths(generators, num_draft, "num_draft")
    if any(not 0 <= n <= max_k for n in num_draft):
        raise ValueError(f"num_draft entries must be in [0, max_k={max_k}], got {num_draft}")
    # [B, max_k]
    noise = torch.full((len(generators), max_k), UNUSED_UNIFORM, dtype=torch.float32)
    for b, (gen, n) in enumerate(zip(generators, num_draft, strict=True)):
        if gen is not None and n > 0:
            noise[b, :n] = torch.rand(n, generator=gen, device=gen.device).cpu()
    return noise


def emit_uniforms(generators: list[torch.Generator | None]) -> torch.Tensor:
    """One U[0, 1) float64 [B] per request for its emitted token (after its accept tests:
    call `uniform_noise` first); `None` generators get UNUSED_UNIFORM and draw nothing."""
    # [B]
    uniforms = torch.full((len(generators),), UNUSED_UNIFORM, dtype=torch.float64)
    for b, gen in enumerate(generators):
        if gen is not None:
            draw = torch.rand(1, generator=gen, dtype=torch.float64, device=gen.device)
            uniforms[b] = float(draw)
    return uniforms


def sample_sparse(
    ids: torch.Tensor,  # [N, S] int64
    probs: torch.Tensor,  # [N, S] float32, rows sum to 1
    generators: list[torch.Generator | None],
) -> torch.Tensor:
    """One token [N] int64 per row from the sparse distribution (ids, probs), by the
    exponential race with the row's generator; a `None` generator takes the argmax."""
    if ids.shape != probs.shape or ids.dim() != 2:
        raise ValueError(f"ids and probs must both be [N, S], got {ids.shape} and {probs.shape}")
    if len(generators) != ids.shape[0]:
        raise ValueError(f"need {ids.shape[0]} generators, got {len(generators)}")
    # [N, S]
    noise = torch.full(probs.shape, UNUSED_EXPONENTIAL, dtype=torch.float32)
    for row, gen in enumerate(generators):
        if gen is not None:
            noise[row] = _exponential((probs.shape[1],), gen).cpu()
    # [N] argmax_s q_s / E_s ~ q
    choice = (probs.float() / noise.to(probs.device)).argmax(dim=-1, keepdim=True)
    return ids.gather(-1, choice).squeeze(-1)


def _exponential(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    draws = torch.empty(shape, dtype=torch.float32, device=gen.device)
    return draws.exponential_(generator=gen).clamp_(min=MIN_EXPONENTIAL)


def _check_lengths(generators: list[torch.Generator | None], counts: list[int], name: str) -> None:
    if len(generators) != len(counts):
        raise ValueError(f"{name} has {len(counts)} entries for {len(generators)} generators")
