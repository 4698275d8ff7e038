"""The verifier's per-draft view of listed proposals in one C pass (rejection.py's
_native_listed_stats) against the torch ops it replaces: the draft's proposal probability,
its target probability (of its class U where it is an unlisted tail draft), which drafts are
tail drafts and which proposals are point masses."""

import pytest
import torch
from sampling_batches import random_batch

from daemon.runtime.model import native
from daemon.runtime.sampling.rejection import (
    _emitted_token,
    _native_listed_stats,
    _proposal_prob_of_draft,
    _Sparse,
    _unlisted_mass,
    matched_drafts,
    rejection_sample,
)

needs_native = pytest.mark.skipif(native.kernels() is None, reason="native kernels not built")


@needs_native
@pytest.mark.parametrize("seed", range(6))
def test_native_stats_match_the_torch_ops(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    inputs = random_batch(
        gen, num_seqs=48, max_k=4, vocab_size=300, num_sparse=[1, 3, 40][seed % 3]
    )
    assert inputs.draft_sparse_ids is not None and inputs.draft_sparse_probs is not None
    tail = inputs.draft_sparse_tail
    assert tail is not None
    tail[::7] = 0.0  # some positions without a tail
    probs = inputs.draft_sparse_probs
    probs[1::9] = 0.0  # ... and some of those point masses (all-zero probs, no tail)
    sparse = _Sparse(inputs.draft_sparse_ids, probs, tail)
    drafts = inputs.draft_token_ids.clamp(min=0)
    max_k = drafts.shape[1]
    stats = _native_listed_stats(drafts, sparse, inputs.target_probs, inputs.is_greedy)
    assert stats is not None
    q, p, is_tail, is_point = stats
    q_ref, tail_ref = _proposal_prob_of_draft(drafts, sparse, inputs.is_greedy)
    tail_ref = torch.zeros_like(is_tail) if tail_ref is None else tail_ref
    assert torch.equal(q, q_ref)
    assert torch.equal(is_tail, tail_ref)
    assert is_tail.any() and (~is_tail).any()
    p_ref = inputs.target_probs[:, :max_k].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    unlisted = _unlisted_mass(inputs.target_probs[:, :max_k], sparse)
    assert torch.equal(p[~is_tail], p_ref[~is_tail])
    # p(U): float32 of a double sum against torch's float32 sum, a few ulp apart at most
    torch.testing.assert_close(p[is_tail], unlisted[is_tail], rtol=1e-6, atol=1e-7)
    everything = torch.full((drafts.shape[0],), max_k)
    no_greedy = torch.zeros(drafts.shape[0], dtype=torch.bool)
    points = matched_drafts(everything, probs, tail, no_greedy, max_k)
    assert torch.equal(is_point, points)
    assert is_point.any()


@needs_native
@pytest.mark.parametrize("num_sparse", [None, 1, 5, 40])
@pytest.mark.parametrize("vocab", [200, 3000])
def test_rejection_with_and_without_the_native_kernels(
    monkeypatch: pytest.MonkeyPatch, num_sparse: int | None, vocab: int
) -> None:
    """The whole sampler with the C passes (the drafts' stats, the residual's token) and with
    torch's ops only: the same accepted lengths and tokens, rejections and bonuses, point
    masses, listed drafts and tail drafts (they could differ only where a uniform falls
    within rounding of a threshold or a CDF boundary; none does in these batches). 3,000:
    three blocks of the inverse CDF, the last one partial."""
    for seed in range(4):
        gen = torch.Generator().manual_seed(100 * seed + vocab)
        inputs = random_batch(gen, num_seqs=64, max_k=4, vocab_size=vocab, num_sparse=num_sparse)
        monkeypatch.setenv(native.DISABLE_ENV, "1")
        out, num = rejection_sample(*inputs.args())
        monkeypatch.setenv(native.DISABLE_ENV, "0")
        ref_out, ref_num = rejection_sample(*inputs.args())
        assert torch.equal(num, ref_num)
        assert torch.equal(out, ref_out)
        rejected = num <= inputs.num_draft_tokens
        assert rejected.any() and (~rejected).any()  # corrections and bonuses both sampled


def _small_batch(num_sparse: int) -> tuple:
    gen = torch.Generator().manual_seed(21)
    inputs = random_batch(gen, num_seqs=16, max_k=3, vocab_size=50, num_sparse=num_sparse)
    return inputs.args()


@needs_native
def test_int32_ids_are_read_as_what_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    """int32 drafts and listed ids (the checks let them through) give int64's answer."""
    args = list(_small_batch(4))
    expected = rejection_sample(*args)
    args[0] = args[0].int()  # draft_token_ids
    args[2] = args[2].int()  # draft_sparse_ids
    got = rejection_sample(*args)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.mark.parametrize("native_on", ["1", "0"])
def test_an_id_past_the_vocabulary_after_a_rows_drafts_is_refused(
    monkeypatch: pytest.MonkeyPatch, native_on: str
) -> None:
    """A padding slot past num_draft_tokens holding an id >= V: an error on both paths (the
    torch path's gathers raise), not a read past the row."""
    monkeypatch.setenv(native.DISABLE_ENV, native_on)
    args = list(_small_batch(4))
    num_draft = args[1]
    row = int((num_draft < 3).nonzero()[0])
    drafts = args[0].clone()
    drafts[row, 2] = 10**12
    args[0] = drafts
    with pytest.raises((IndexError, RuntimeError)):
        rejection_sample(*args)


@needs_native
def test_lists_of_no_entries_are_lists_not_point_masses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Corrections drawn from [B, K, 0] lists with tails (q: the tail spread like p) are the
    same with the kernels on and off: an empty list is not a point mass on the draft."""
    gen = torch.Generator().manual_seed(4)
    num_seqs, max_k, vocab = 24, 3, 40
    target = torch.softmax(torch.randn(num_seqs, max_k + 1, vocab, generator=gen) * 2, -1)
    drafts = target[:, :max_k].argmax(-1)  # the likeliest: the residual removes most of them
    sparse = _Sparse(
        torch.zeros(num_seqs, max_k, 0, dtype=torch.long),
        torch.zeros(num_seqs, max_k, 0),
        torch.full((num_seqs, max_k), 0.6),
    )
    num_draft = torch.full((num_seqs,), max_k)
    at = torch.randint(0, max_k, (num_seqs,), generator=gen)  # a rejection at each row
    uniform = torch.rand(num_seqs, generator=gen, dtype=torch.float64)
    args = (drafts, num_draft, at, sparse, target, None, torch.zeros(num_seqs, dtype=torch.bool),
            uniform, torch.full((num_seqs,), -1))  # fmt: skip
    tokens = {}
    for native_on in ("1", "0"):
        monkeypatch.setenv(native.DISABLE_ENV, native_on)
        tokens[native_on] = _emitted_token(*args)
    assert torch.equal(tokens["1"], tokens["0"])
    assert (tokens["0"] == drafts.gather(1, at[:, None]).squeeze(1)).any()  # q(x) < p(x) kept


@needs_native
@pytest.mark.parametrize("bad", [-1, 50, -7])
def test_the_c_pass_refuses_a_listed_id_outside_the_vocabulary(bad: int) -> None:
    """The kernel checks what it reads itself (rejection_sample's checks run before it)."""
    ids = torch.tensor([[[1, bad]]])
    sparse = _Sparse(ids, torch.tensor([[[0.2, 0.3]]]), torch.tensor([[0.5]]))
    target = torch.softmax(torch.randn(1, 2, 50), -1)
    with pytest.raises(IndexError, match="listed id"):
        _native_listed_stats(torch.tensor([[1]]), sparse, target, torch.tensor([False]))
