"""Prefill: run prompts through the target, a chunk at a time, and sample each one's first token."""

from dataclasses import dataclass

import torch

from daemon.runtime.engine.sequence import Sequence
from daemon.runtime.model.batch import ForwardBatch, LogitsMode, group_by_length, prefill_budget
from daemon.runtime.model.protocol import CausalLM
from daemon.runtime.sampling.argmax import argmax_last
from daemon.runtime.sampling.gumbel_field import field_keys, gumbel_argmax
from daemon.runtime.sampling.logits import process_logits


@dataclass(frozen=True, slots=True)
class Chunk:
    """`num_tokens` of a sequence's prompt, from position `start`, to put in the target's cache."""

    seq: Sequence
    start: int
    num_tokens: int

    @property
    def completes(self) -> bool:
        """Whether the prompt is all in once this chunk is."""
        return self.start + self.num_tokens == self.seq.num_prompt_tokens


def plan_chunks(seqs: list[Sequence], budget: int | None) -> list[Chunk]:
    """The prompt tokens to prefill this step, in admission order (first come, first served):
    every prompt's rest where `budget` is None, else `budget` tokens in all, the last
    sequence taken getting what is left of it. A sequence with nothing left gets no chunk."""
    chunks: list[Chunk] = []
    left = budget
    for seq in seqs:
        rest = seq.num_prompt_tokens - seq.num_prefilled
        if rest <= 0:
            continue
        if left is not None:
            if left <= 0:
                break
            rest = min(rest, left)
            left -= rest
        chunks.append(Chunk(seq, seq.num_prefilled, rest))
    return chunks


def prefill(target: CausalLM, chunks: list[Chunk], max_tokens_per_pass: int | None) -> None:
    """Put each chunk of prompt in the target's cache; a sequence whose prompt is then all in
    commits its first output token (sampled from the last position's logits; a pass that
    completes no prompt asks for none).

    Chunks from position 0 go in groups of similar length (sorted), so that padding wastes
    little compute, `max_tokens_per_pass` padded tokens at most (None: the device's default):
    attention then runs in the kernel's own causal mode. A chunk that continues a prompt goes
    alone, in pieces of at most that many tokens: a row of T tokens after a cached prefix
    attends with the causal mask aligned to the lower right (attention.py), where rows of
    several sequences at other starts take an explicit mask of G x T x L (a 28k-token rest
    after 4k tokens: ~7 GB at 4 query heads per KV head, in bfloat16).
    """
    budget = prefill_budget(max_tokens_per_pass, target.device)
    fresh = [c for c in chunks if c.start == 0]
    for group in group_by_length([c.num_tokens for c in fresh], budget):
        _prefill_group(target, [fresh[i] for i in group])
    for c in [c for c in chunks if c.start > 0]:
        end = c.start + c.num_tokens
        for start in range(c.start, end, budget):
            _prefill_group(target, [Chunk(c.seq, start, min(budget, end - start))])


def _prefill_group(target: CausalLM, chunks: list[Chunk]) -> None:
    done = [b for b, c in enumerate(chunks) if c.completes]
    batch = ForwardBatch(
        slots=[c.seq.slot for c in chunks],
        token_ids=[
            list(c.seq.request.prompt_token_ids[c.start : c.start + c.num_tokens]) for c in chunks
        ],
        start_positions=[c.start for c in chunks],
        # a group that completes no prompt samples nothing: no LM head (at a vocabulary of
        # 152k and width 4096, 1.2 GFLOP per row, each piece of a long prompt paid it)
        logits_mode=LogitsMode.LAST if done else LogitsMode.NONE,
        is_prefill=True,
    )
    logits = target.forward(batch)  # [B, V] or None
    if done:
        assert logits is not None
        seqs = [chunks[b].seq for b in done]
        rows = logits if len(done) == len(chunks) else logits[done]  # [D, V]
        for seq, token in zip(seqs, sample_tokens(seqs, rows), strict=True):
            seq.append([token])
    for c in chunks:  # last: a sequence whose prompt is all in has its first token
        c.seq.num_prefilled = c.start + c.num_tokens


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
