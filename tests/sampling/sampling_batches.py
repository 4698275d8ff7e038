"""Random rejection-sampler batches shared by the reference and the kernel tests."""

from dataclasses import dataclass

import torch

from daemon.runtime.sampling.logits import sparse_top_k
from daemon.runtime.sampling.rejection import PLACEHOLDER_TOKEN_ID


@dataclass(slots=True)
class RejectionInputs:
    draft_token_ids: torch.Tensor  # [B, K] int64
    num_draft_tokens: torch.Tensor  # [B] int64
    draft_sparse_ids: torch.Tensor | None  # [B, K, S] int64
    draft_sparse_probs: torch.Tensor | None  # [B, K, S] float32
    target_probs: torch.Tensor  # [B, K+1, V] float32
    is_greedy: torch.Tensor  # [B] bool
    uniform: torch.Tensor  # [B, K] float32
    emit_uniform: torch.Tensor  # [B] float64
    draft_sparse_tail: torch.Tensor | None = None  # [B, K] float32
    position_keys: torch.Tensor | None = None  # [B, K] int64 Gumbel field keys

    def args(self) -> tuple:
        return (
            self.draft_token_ids,
            self.num_draft_tokens,
            self.draft_sparse_ids,
            self.draft_sparse_probs,
            self.target_probs,
            self.is_greedy,
            self.uniform,
            self.emit_uniform,
            self.draft_sparse_tail,
            self.position_keys,
        )


def random_batch(
    gen: torch.Generator,
    num_seqs: int,
    max_k: int,
    vocab_size: int,
    num_sparse: int | None,
    with_tails: bool = True,
) -> RejectionInputs:
    """A batch mixing greedy and sampled rows, point-mass and sparse positions, num_draft 0,
    drafts equal to the target argmax (so greedy rows accept some) and peaked targets (so
    sampled rows accept some). num_sparse None: no sparse tensors at all; `with_tails`: some
    sparse positions carry a tail (and the batch its field keys)."""
    # [B, K+1, V] peaked targets: a few rows are near one-hot
    sharpness = torch.rand(num_seqs, max_k + 1, 1, generator=gen) * 6
    logits = torch.randn(num_seqs, max_k + 1, vocab_size, generator=gen) * sharpness
    target_probs = torch.softmax(logits, dim=-1)
    num_draft = torch.randint(0, max_k + 1, (num_seqs,), generator=gen)
    # [B, K] drafts: the target argmax half of the time, else a random token
    random_ids = torch.randint(0, vocab_size, (num_seqs, max_k), generator=gen)
    use_argmax = torch.rand(num_seqs, max_k, generator=gen) < 0.5
    drafts = torch.where(use_argmax, target_probs[:, :max_k].argmax(-1), random_ids)
    is_real = torch.arange(max_k) < num_draft.unsqueeze(-1)
    drafts = torch.where(is_real, drafts, PLACEHOLDER_TOKEN_ID)
    sparse_ids = sparse_probs = sparse_tail = position_keys = None
    if num_sparse is not None:
        sparse_ids, sparse_probs = _sparse_around(gen, drafts.clamp(min=0), vocab_size, num_sparse)
        if with_tails:
            sparse_probs, sparse_tail = _with_tails(gen, sparse_probs)
            position_keys = torch.randint(-(2**62), 2**62, (num_seqs, max_k), generator=gen)
    return RejectionInputs(
        draft_token_ids=drafts,
        num_draft_tokens=num_draft,
        draft_sparse_ids=sparse_ids,
        draft_sparse_probs=sparse_probs,
        target_probs=target_probs,
        is_greedy=torch.rand(num_seqs, generator=gen) < 0.3,
        uniform=torch.rand(num_seqs, max_k, generator=gen),
        emit_uniform=torch.rand(num_seqs, generator=gen, dtype=torch.float64),
        draft_sparse_tail=sparse_tail,
        position_keys=position_keys,
    )


def _with_tails(gen: torch.Generator, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Half of the sampled positions move some of their mass to a tail (the listed probs
    shrink to make room), and a few sampled positions are all tail."""
    num_seqs, max_k, _ = probs.shape
    is_sampled = (probs > 0).any(dim=-1)  # [B, K]
    tail = torch.rand(num_seqs, max_k, generator=gen) * 0.6
    tail = torch.where(torch.rand(num_seqs, max_k, generator=gen) < 0.5, tail, 0.0)
    all_tail = torch.rand(num_seqs, max_k, generator=gen) < 0.1
    tail = torch.where(all_tail, 1.0, tail)
    tail = torch.where(is_sampled, tail, 0.0)
    return probs * (1.0 - tail).unsqueeze(-1), tail


def _sparse_around(
    gen: torch.Generator, drafts: torch.Tensor, vocab_size: int, num_sparse: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse proposals [B, K, S] that list each draft token; a quarter of the positions are
    all-zero (point mass) and some entries are zero-prob padding."""
    num_seqs, max_k = drafts.shape
    logits = torch.randn(num_seqs * max_k, vocab_size, generator=gen) * 2
    # make the draft token the most likely one, so top-S lists it
    logits.scatter_(-1, drafts.reshape(-1, 1), 100.0)
    ids, probs = sparse_top_k(torch.softmax(logits, -1), num_sparse)  # [B*K, S]
    ids = ids.view(num_seqs, max_k, num_sparse)
    probs = probs.view(num_seqs, max_k, num_sparse)
    is_padding = torch.rand(ids.shape, generator=gen) < 0.2
    is_padding[..., 0] = False  # keep the draft token itself
    probs = torch.where(is_padding, 0.0, probs)
    ids = torch.where(is_padding, 0, ids)  # padding repeats id 0, prob 0
    is_point_mass = torch.rand(num_seqs, max_k, 1, generator=gen) < 0.25
    return ids, torch.where(is_point_mass, 0.0, probs)
