"""The residual max(0, p - q) built in place (one subtract-and-clamp per row, then the listed
tokens and the draft token fixed up) equals the one from the dense proposal q, built the
plain way from the proposal convention in rejection.py: listed tokens, the tail over the
unlisted ones shaped like the target there, point masses, padding entries repeating a listed
id, bonus rows."""

import torch

from daemon.runtime.sampling.rejection import _residual_in_place, _Sparse

VOCAB = 50


def dense_q(
    p: torch.Tensor,  # [B, V] the target at each row's position
    drafts: torch.Tensor,  # [B, K]
    num_draft: torch.Tensor,  # [B]
    position: torch.Tensor,  # [B]
    sparse: _Sparse | None,
) -> torch.Tensor:
    """q [B, V] at each row's position, one row at a time, straight from the convention."""
    q = torch.zeros(drafts.shape[0], VOCAB)
    for b in range(drafts.shape[0]):
        j = int(position[b])
        if j >= int(num_draft[b]):
            continue  # the bonus position: nothing was proposed
        if sparse is None:
            q[b, drafts[b, j]] = 1.0
            continue
        ids, probs, tail = sparse.ids[b, j], sparse.probs[b, j], float(sparse.tail[b, j])
        listed = {int(i): float(pr) for i, pr in zip(ids, probs, strict=True) if pr > 0}
        if not listed and tail == 0.0:
            q[b, drafts[b, j]] = 1.0
            continue
        unlisted = torch.ones(VOCAB, dtype=torch.bool)
        unlisted[list(listed)] = False
        p_unlisted = float(p[b][unlisted].sum())
        if p_unlisted > 0:
            q[b] = torch.where(unlisted, tail * p[b] / p_unlisted, 0.0)
        for token, prob in listed.items():
            q[b, token] = prob
    return q


def make_case(seed: int, with_sparse: bool) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    num_seqs, max_k, width = 12, 4, 6
    drafts = torch.randint(0, VOCAB, (num_seqs, max_k), generator=gen)
    num_draft = torch.randint(0, max_k + 1, (num_seqs,), generator=gen)
    position = (torch.rand(num_seqs, generator=gen) * (num_draft + 1)).long().clamp(max=num_draft)
    p = torch.softmax(3 * torch.randn(num_seqs, VOCAB, generator=gen), dim=-1)  # [B, V]
    if not with_sparse:
        return p, drafts, num_draft, position, None
    ids = torch.stack(
        [torch.randperm(VOCAB, generator=gen)[:width] for _ in range(num_seqs * max_k)]
    )
    ids = ids.view(num_seqs, max_k, width)  # [B, K, S] unique per position
    probs = torch.rand(num_seqs, max_k, width, generator=gen) ** 2
    probs[..., width - 2 :] = 0.0  # two padding entries per position...
    ids[..., width - 1] = ids[..., 0]  # ...one repeating a listed id
    probs = probs / probs.sum(-1, keepdim=True) * 0.7
    tail = torch.full((num_seqs, max_k), 0.3)
    probs[0] = 0.0  # sequence 0: point masses (all zero, no tail)
    tail[0] = 0.0
    tail[1] = 0.0  # sequence 1: listed tokens only
    probs[1] = probs[1] / probs[1].sum(-1, keepdim=True)
    drafts[2] = ids[2, :, 1]  # sequence 2: the draft token is a listed one
    return p, drafts, num_draft, position, _Sparse(ids, probs, tail)


def test_in_place_residual_matches_the_dense_proposal() -> None:
    for seed in range(20):
        for with_sparse in (True, False):
            p, drafts, num_draft, position, sparse = make_case(seed, with_sparse)
            expected = (p - dense_q(p, drafts, num_draft, position, sparse)).clamp(min=0.0)
            got = _residual_in_place(p.clone(), drafts, num_draft, position, sparse)
            torch.testing.assert_close(got, expected, rtol=0, atol=2e-7)


def test_bonus_rows_keep_p_untouched() -> None:
    p, drafts, num_draft, _, sparse = make_case(3, with_sparse=True)
    got = _residual_in_place(p.clone(), drafts, num_draft, num_draft.clone(), sparse)
    assert torch.equal(got, p)
