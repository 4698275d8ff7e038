"""Hand-made cases for the rejection sampler (vLLM-style). `sampler` is the torch reference,
and also the Triton kernel when run under the interpreter (see conftest.py)."""

from collections.abc import Callable

import pytest
import torch
from sampling_batches import random_batch

from daemon.runtime.sampling.rejection import PLACEHOLDER_TOKEN_ID, rejection_sample

P = PLACEHOLDER_TOKEN_ID
VOCAB = 6


def one_hot_probs(tokens: list[list[int]]) -> torch.Tensor:
    """[B, K+1, V] targets whose argmax at each position is the given token."""
    logits = torch.full((len(tokens), len(tokens[0]), VOCAB), -5.0)
    logits.scatter_(-1, torch.tensor(tokens).unsqueeze(-1), 5.0)
    return torch.softmax(logits, dim=-1)


def run_greedy(
    sampler: Callable, drafts: list[list[int]], num_draft: list[int], target_argmax: list[list[int]]
):
    num_seqs, max_k = len(drafts), len(target_argmax[0]) - 1
    draft_ids = torch.tensor(drafts, dtype=torch.long).view(num_seqs, max_k)
    return sampler(
        draft_ids,
        torch.tensor(num_draft, dtype=torch.long),
        None,
        None,
        one_hot_probs(target_argmax),
        torch.ones(num_seqs, dtype=torch.bool),
        torch.rand(num_seqs, max_k),
        torch.rand(num_seqs, dtype=torch.float64),
    )


def test_perfect_match_accepts_all_and_adds_bonus(sampler: Callable) -> None:
    out, num = run_greedy(sampler, [[1, 2, 3]], [3], [[1, 2, 3, 4]])
    assert out.tolist() == [[1, 2, 3, 4]]
    assert num.tolist() == [4]


def test_early_mismatch_emits_target_argmax(sampler: Callable) -> None:
    out, num = run_greedy(sampler, [[1, 2, 3], [1, 5, 3]], [3, 3], [[0, 2, 3, 4], [1, 2, 3, 4]])
    assert out.tolist() == [[0, P, P, P], [1, 2, P, P]]
    assert num.tolist() == [1, 2]


def test_empty_draft_emits_one_target_token(sampler: Callable) -> None:
    out, num = run_greedy(sampler, [[P, P]], [0], [[4, 1, 2]])
    assert out.tolist() == [[4, P, P]]
    assert num.tolist() == [1]


def test_k_zero_for_whole_batch(sampler: Callable) -> None:
    out, num = run_greedy(sampler, [[], []], [0, 0], [[3], [5]])
    assert out.tolist() == [[3], [5]]
    assert num.tolist() == [1, 1]


def test_empty_batch(sampler: Callable) -> None:
    empty = torch.empty(0, 2, dtype=torch.long)
    out, num = sampler(
        empty,
        torch.empty(0, dtype=torch.long),
        None,
        None,
        torch.empty(0, 3, VOCAB),
        torch.empty(0, dtype=torch.bool),
        torch.empty(0, 2),
        torch.empty(0, dtype=torch.float64),
    )
    assert out.shape == (0, 3) and num.shape == (0,)


def test_mixed_batch_with_rows_without_drafts(sampler: Callable) -> None:
    drafts = [[1, 2], [P, P], [3, 3], [P, P]]
    targets = [[1, 2, 0], [4, 4, 4], [3, 1, 2], [5, 0, 0]]
    out, num = run_greedy(sampler, drafts, [2, 0, 2, 0], targets)
    assert out.tolist() == [[1, 2, 0], [4, P, P], [3, 1, P], [5, P, P]]
    assert num.tolist() == [3, 1, 2, 1]


def sampled_case(
    sampler: Callable,
    target: list[list[float]],
    drafts: list[int],
    uniform: list[float],
    emit: float = 0.0,
    sparse: tuple[list[list[int]], list[list[float]]] | None = None,
):
    """One sampled sequence: target [K+1, V] probs, drafts [K]; `emit` is the uniform that
    picks the emitted token by the inverse CDF of its (unnormalised) distribution."""
    max_k = len(drafts)
    sparse_ids = sparse_probs = None
    if sparse is not None:
        sparse_ids = torch.tensor([sparse[0]], dtype=torch.long)
        sparse_probs = torch.tensor([sparse[1]])
    return sampler(
        torch.tensor([drafts], dtype=torch.long).view(1, max_k),
        torch.tensor([max_k]),
        sparse_ids,
        sparse_probs,
        torch.tensor([target]),
        torch.tensor([False]),
        torch.tensor([uniform]).view(1, max_k),
        torch.tensor([emit], dtype=torch.float64),
    )


def test_sampled_zero_target_prob_is_rejected_and_residual_excludes_draft(
    sampler: Callable,
) -> None:
    # p(1) = 0 at position 0: x = 1 is rejected even with u = 0; the residual
    # max(0, p - onehot(1)) = p = [0.7, 0, 0.3]: CDF ends 0.7, 0.7, 1.0, so 0.75 picks 2
    # and 0.69 picks 0; the zero-mass token 1 never (0.7 falls past its empty range).
    target = [[0.7, 0.0, 0.3], [1.0, 0.0, 0.0]]
    out, num = sampled_case(sampler, target, [1], [0.0], emit=0.75)
    assert out.tolist() == [[2, P]] and num.tolist() == [1]
    for emit, token in ((0.69, 0), (0.7, 2)):
        out, _ = sampled_case(sampler, target, [1], [0.0], emit=emit)
        assert out.tolist() == [[token, P]]


def test_sampled_rejection_never_resamples_the_rejected_token(sampler: Callable) -> None:
    # q = point mass on 0, p(0) = 0.9: rejected when u >= 0.9. Residual = [0, 0.1, 0]: only 1.
    target = [[0.9, 0.1, 0.0], [0.0, 0.0, 1.0]]
    for emit in (0.0, 0.5, 0.999):
        out, _ = sampled_case(sampler, target, [0], [0.95], emit=emit)
        assert out.tolist() == [[1, P]]
    out, _ = sampled_case(sampler, target, [0], [0.85])  # u < p/q = 0.9: accepted, then bonus 2
    assert out.tolist() == [[0, 2]]


def test_sparse_q_acceptance_threshold(sampler: Callable) -> None:
    # q(x=2) = 0.8 > p(2) = 0.4: accept iff u < 0.5
    target = [[0.3, 0.3, 0.4, 0.0], [0.0, 0.0, 0.0, 1.0]]
    sparse = ([[2, 1, 0]], [[0.8, 0.2, 0.0]])
    accepted, _ = sampled_case(sampler, target, [2], [0.49], sparse=sparse)
    assert accepted.tolist() == [[2, 3]]
    # rejected: residual max(0, p - q) = [0.3, 0.1, 0, 0]: emit in [0.75, 1) picks token 1
    rejected, _ = sampled_case(sampler, target, [2], [0.51], emit=0.8, sparse=sparse)
    assert rejected.tolist() == [[1, P]]
    rejected, _ = sampled_case(sampler, target, [2], [0.51], emit=0.7, sparse=sparse)
    assert rejected.tolist() == [[0, P]]


def test_residual_all_zero_falls_back_to_target(sampler: Callable) -> None:
    # p == q; u = 1.0 (outside [0, 1)) forces a rejection, the residual is empty,
    # and the inverse CDF of p at 0.6 picks token 1.
    target = [[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]
    sparse = ([[0, 1]], [[0.5, 0.5]])
    out, _ = sampled_case(sampler, target, [0], [1.0], emit=0.6, sparse=sparse)
    assert out.tolist() == [[1, P]]


def test_all_zero_sparse_probs_mean_point_mass(sampler: Callable) -> None:
    # q point mass on x=1 (p(1)=0.5): accept iff u < 0.5; the zero-prob padding id 0 is ignored
    target = [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]
    sparse = ([[0, 0]], [[0.0, 0.0]])
    out, _ = sampled_case(sampler, target, [1], [0.6], emit=0.9, sparse=sparse)
    assert out.tolist() == [[0, P]]  # residual [0.5, 0, 0]
    out, _ = sampled_case(sampler, target, [1], [0.4], sparse=sparse)
    assert out.tolist() == [[1, 2]]


def test_mismatched_shapes_raise(sampler: Callable) -> None:
    drafts = torch.zeros(2, 3, dtype=torch.long)
    good = dict(
        num_draft_tokens=torch.tensor([3, 3]),
        draft_sparse_ids=None,
        draft_sparse_probs=None,
        target_probs=torch.full((2, 4, VOCAB), 1 / VOCAB),
        is_greedy=torch.tensor([True, False]),
        uniform=torch.rand(2, 3),
        emit_uniform=torch.rand(2, dtype=torch.float64),
    )
    sampler(drafts, **good)
    bad_cases = {
        "target_probs": torch.ones(2, 3, VOCAB),
        "uniform": torch.rand(2, 4),
        "emit_uniform": torch.rand(3, dtype=torch.float64),
        "num_draft_tokens": torch.tensor([4, 0]),
        "draft_sparse_ids": torch.zeros(2, 3, 2, dtype=torch.long),
        "is_greedy": torch.tensor([1, 0]),
    }
    for name, value in bad_cases.items():
        with pytest.raises(ValueError):
            sampler(drafts, **{**good, name: value})
    with pytest.raises(ValueError, match="draft_token_ids"):
        sampler(torch.full((2, 3), VOCAB), **good)


def test_output_invariants_on_random_batches(sampler: Callable) -> None:
    gen = torch.Generator().manual_seed(1)
    for num_sparse in (None, 3):
        inputs = random_batch(
            gen,
            num_seqs=64,
            max_k=4,
            vocab_size=9,
            num_sparse=num_sparse,
            with_tails=sampler is rejection_sample,
        )  # the kernel takes none
        out, num = sampler(*inputs.args())
        num_draft = inputs.num_draft_tokens
        assert ((num >= 1) & (num <= num_draft + 1)).all()
        positions = torch.arange(5)
        is_accepted = positions[:4] < (num - 1).unsqueeze(-1)
        assert torch.equal(out[:, :4][is_accepted], inputs.draft_token_ids[is_accepted])
        assert (out.gather(1, (num - 1).unsqueeze(-1)) >= 0).all()
        assert (out[positions >= num.unsqueeze(-1)] == P).all()
        # greedy rows emit the target argmax at the last position
        last = inputs.target_probs.argmax(-1).gather(1, (num - 1).unsqueeze(-1)).squeeze(-1)
        emitted = out.gather(1, (num - 1).unsqueeze(-1)).squeeze(-1)
        assert torch.equal(emitted[inputs.is_greedy], last[inputs.is_greedy])


def test_out_of_range_values_raise_with_what_is_wrong(sampler: Callable) -> None:
    """Each value check names its argument; a placeholder past a row's drafts is not one."""
    drafts = torch.tensor([[1, 2, 0], [3, -1, -1]])  # row 1 drafts one token, then placeholders
    sparse_ids = torch.zeros(2, 3, 2, dtype=torch.long)
    good = dict(
        num_draft_tokens=torch.tensor([3, 1]),
        draft_sparse_ids=sparse_ids,
        draft_sparse_probs=torch.zeros(2, 3, 2),
        target_probs=torch.full((2, 4, VOCAB), 1 / VOCAB),
        is_greedy=torch.tensor([False, False]),
        uniform=torch.rand(2, 3),
        emit_uniform=torch.rand(2, dtype=torch.float64),
    )
    sampler(drafts, **good)
    with pytest.raises(ValueError, match=r"num_draft_tokens must be in \[0, K=3\]"):
        sampler(drafts, **{**good, "num_draft_tokens": torch.tensor([3, -1])})
    with pytest.raises(ValueError, match=r"draft_token_ids must be in \[0, V="):
        sampler(torch.tensor([[1, 2, 0], [VOCAB, -1, -1]]), **good)
    with pytest.raises(ValueError, match=r"draft_token_ids must be in \[0, V="):
        sampler(torch.tensor([[1, -2, 0], [3, -1, -1]]), **good)
    bad_ids = sparse_ids.clone()
    bad_ids[1, 2, 1] = VOCAB
    with pytest.raises(ValueError, match=r"draft_sparse_ids must be in \[0, V="):
        sampler(drafts, **{**good, "draft_sparse_ids": bad_ids})
    bad_ids[1, 2, 1] = -1
    with pytest.raises(ValueError, match=r"draft_sparse_ids must be in \[0, V="):
        sampler(drafts, **{**good, "draft_sparse_ids": bad_ids})
