"""One verify pass: the target scores [last token + drafts] for every sequence at once, and
the rejection sampler decides what is committed."""

import time
from dataclasses import dataclass

import torch

from daemon.runtime.device import synchronize
from daemon.runtime.engine.sequence import Sequence
from daemon.runtime.model.batch import ForwardBatch, LogitsMode
from daemon.runtime.model.protocol import CausalLM
from daemon.runtime.proposers.base import Proposals
from daemon.runtime.sampling.dispatch import rejection_sample_for_device
from daemon.runtime.sampling.gumbel_field import field_keys
from daemon.runtime.sampling.logits import process_logits, softmax_at_temperatures_
from daemon.runtime.sampling.matching import accept_matching, target_choices
from daemon.runtime.sampling.random import emit_uniforms, uniform_noise


@dataclass(slots=True)
class Verdict:
    emitted: list[list[int]]  # [B] accepted drafts then the correction or bonus token
    num_accepted: list[int]  # [B]
    verify_time_s: float  # the target's forward pass only
    tokens_per_seq: int  # T of the verify pass (max k + 1)


def verify(target: CausalLM, seqs: list[Sequence], proposals: Proposals) -> Verdict:
    drafts = proposals.draft_token_ids  # [B, K]
    num_draft = proposals.num_draft_tokens
    draft_lists = [row[:n] for row, n in zip(drafts.tolist(), num_draft, strict=True)]
    batch = ForwardBatch(
        slots=[s.slot for s in seqs],
        token_ids=[[s.token_ids[-1], *d] for s, d in zip(seqs, draft_lists, strict=True)],
        start_positions=[len(s.token_ids) - 1 for s in seqs],
        logits_mode=LogitsMode.ALL,
    )
    start = time.perf_counter()
    logits = target.forward(batch)  # [B, T, V]
    assert logits is not None
    synchronize(target.device)  # the pass's own time: the adaptive-k cost model learns it
    verify_time_s = time.perf_counter() - start
    max_k = max(num_draft, default=0)
    logits = logits[:, : max_k + 1]  # [B, K+1, V]
    if proposals.sparse_ids is None:  # point masses only: matched, no probabilities needed
        emitted = _match(seqs, logits, draft_lists)
        return _verdict(emitted, verify_time_s, batch.max_chunk_len)
    target_probs = _target_probs(seqs, logits)
    generators = [s.generator for s in seqs]
    num_draft_t = torch.tensor(num_draft, dtype=torch.long)  # [B]
    uniform = uniform_noise(generators, num_draft, max_k)  # [B, K]
    emit_uniform = emit_uniforms(generators)  # [B]
    out, num_out = rejection_sample_for_device(
        drafts[:, :max_k],
        num_draft_t,
        _trim(proposals.sparse_ids, max_k),
        _trim(proposals.sparse_probs, max_k),
        target_probs,
        torch.tensor([s.request.params.is_greedy for s in seqs], dtype=torch.bool),
        uniform,
        emit_uniform,
        _trim(proposals.sparse_tail, max_k),
        _position_keys(seqs, max_k),
        _bonus_keys(seqs, num_draft),
    )
    out_lists, counts = out.tolist(), num_out.tolist()
    emitted = [row[:n] for row, n in zip(out_lists, counts, strict=True)]
    return _verdict(emitted, verify_time_s, batch.max_chunk_len)


def _verdict(emitted: list[list[int]], verify_time_s: float, tokens_per_seq: int) -> Verdict:
    """Each sequence's emitted tokens: its accepted drafts, then one token of its own."""
    return Verdict(
        emitted=emitted,
        num_accepted=[len(e) - 1 for e in emitted],
        verify_time_s=verify_time_s,
        tokens_per_seq=tokens_per_seq,
    )


def _match(seqs: list[Sequence], logits: torch.Tensor, drafts: list[list[int]]) -> list[list[int]]:
    """Point-mass drafts against the target's own choices (sampling/matching.py): each
    sequence's emitted tokens."""
    choices = target_choices(
        logits,  # [B, K+1, V]
        [s.request.params for s in seqs],
        [len(d) + 1 for d in drafts],
        [(s.draft_seed, len(s.token_ids)) for s in seqs],
        hints=drafts,  # coupled drafts are usually the choices: the searches start there
    )
    return accept_matching(drafts, choices)


def _target_probs(seqs: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
    """[B, K+1, V] logits -> the target's processed distribution (greedy rows: argmax only,
    so their logits pass through untouched when the whole batch is greedy)."""
    params = [s.request.params for s in seqs]
    if all(p.is_greedy for p in params):
        return logits
    num_seqs, rows, vocab = logits.shape
    flat = logits.reshape(num_seqs * rows, vocab)
    truncates = any(0 < p.top_k < vocab or p.top_p < 1.0 for p in params)
    if not truncates and softmax_at_temperatures_(
        flat, [p.temperature for p in params for _ in range(rows)]
    ):
        return flat.view(num_seqs, rows, vocab)
    probs = process_logits(  # in place: the logits are ours and tens of MB at a real V
        flat,
        torch.tensor([p.temperature for p in params]).repeat_interleave(rows),
        torch.tensor([p.top_k for p in params], dtype=torch.long).repeat_interleave(rows),
        torch.tensor([p.top_p for p in params]).repeat_interleave(rows),
        inplace=True,
    )
    return probs.reshape(num_seqs, rows, vocab)


def _position_keys(seqs: list[Sequence], max_k: int) -> torch.Tensor | None:
    """[B, K] the Gumbel field key of every draft position (the draft seed and the absolute
    position the draft sits at), where some sequence samples; else None."""
    if all(s.request.params.is_greedy for s in seqs) or max_k == 0:
        return None
    seeds = [s.draft_seed for s in seqs for _ in range(max_k)]
    positions = [len(s.token_ids) + j for s in seqs for j in range(max_k)]
    return field_keys(seeds, positions).view(len(seqs), max_k)


def _bonus_keys(seqs: list[Sequence], num_draft: list[int]) -> torch.Tensor | None:
    """[B] the Gumbel field key of each sequence's bonus position (after its drafts), where
    some sequence samples (coupled_bonus.py); else None."""
    if all(s.request.params.is_greedy for s in seqs):
        return None
    positions = [len(s.token_ids) + n for s, n in zip(seqs, num_draft, strict=True)]
    return field_keys([s.draft_seed for s in seqs], positions)


def _trim(sparse: torch.Tensor | None, max_k: int) -> torch.Tensor | None:
    return None if sparse is None else sparse[:, :max_k]
