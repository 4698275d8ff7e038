"""Prefill: run new prompts through the target and sample each one's first token."""

import torch

from daemon.runtime.engine.sequence import Sequence
from daemon.runtime.model.batch import ForwardBatch, LogitsMode, group_by_length, prefill_budget
from daemon.runtime.model.protocol import CausalLM
from daemon.runtime.sampling.argmax import argmax_last
from daemon.runtime.sampling.gumbel_field import field_keys, gumbel_argmax
from daemon.runtime.sampling.logits import process_logits


def prefill(target: CausalLM, seqs: list[Sequence], max_tokens_per_pass: int | None) -> None:
    """Fill the target's cache with each prompt and commit the first output token.

    Prompts go in groups of similar length (sorted), so that padding wastes little compute;
    `max_tokens_per_pass` padded tokens at most (None: the device's default).
    """
    lengths = [s.num_prompt_tokens for s in seqs]
    budget = prefill_budget(max_tokens_per_pass, target.device)
    for group in group_by_length(lengths, budget):
        _prefill_group(target, [seqs[i] for i in group])


def _prefill_group(target: CausalLM, seqs: list[Sequence]) -> None:
    batch = ForwardBatch(
        slots=[s.slot for s in seqs],
        token_ids=[list(s.request.prompt_token_ids) for s in seqs],
        start_positions=[0] * len(seqs),
        logits_mode=LogitsMode.LAST,
    )
    logits = target.forward(batch)  # [B, V]
    assert logits is not None
    for seq, token in zip(seqs, sample_tokens(seqs, logits), strict=True):
        seq.append([token])


def sample_tokens(seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
    """One token per sequence from logits [B, V], with each request's sampling parameters."""
    params = [s.request.params for s in seqs]
    if all(p.is_greedy for p in params):
        return argmax_last(logits).tolist()
    probs = process_logits(  # [B, V]
        logits,
        torch.tensor([p.temperature for p in params]),
        torch.tensor([p.top_k for p in params], dtype=torch.long),
        torch.tensor([p.top_p for p in params]),
    )
    # [B] the Gumbel-max of p with the field of the first output position, as the verifier
    # draws every later token it decides alone (sampling/coupled_bonus.py)
    keys = field_keys([s.draft_seed for s in seqs], [len(s.token_ids) for s in seqs])
    sampled = gumbel_argmax(probs, keys, are_probs=True)
    greedy = torch.tensor([p.is_greedy for p in params], device=probs.device)
    return torch.where(greedy, argmax_last(probs), sampled).tolist()
