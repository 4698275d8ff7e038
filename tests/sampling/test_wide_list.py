"""Widened lists (sampling/wide_list.py): whole bins of log q, best first, down to a mass and
within a budget; the C kernel and the torch path list the same tokens in the same order."""

import math

import pytest
import torch

from daemon.runtime.model import native
from daemon.runtime.sampling import wide_list
from daemon.runtime.sampling.wide_list import LOG_Q_BIN, NUM_LOG_Q_BINS

ROWS = 7


def _case(vocab: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Rows of logits with the awkward ones: 4 a NaN, 5 flat (its best bin holds every token),
    6 truncated (-inf on every other token)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(ROWS, vocab, generator=gen) * (
        0.5 + 4 * torch.rand(ROWS, 1, generator=gen)
    )
    logits[4, 17] = math.nan
    logits[5] = 0.25
    logits[6, ::2] = -math.inf
    rows = torch.tensor([6, 0, 1, 2, 3, 4, 5])  # out of order, every row once
    temps = (0.4 + torch.rand(ROWS, generator=gen, dtype=torch.float64)).clamp(max=1.2)
    log_norms = torch.logsumexp(logits[rows].double() / temps.unsqueeze(-1), dim=-1)
    targets = 0.5 + 0.5 * torch.rand(ROWS, generator=gen, dtype=torch.float64)
    targets[2] = 1.0  # a row the budget stops first
    return logits, rows, temps, log_norms, targets


@pytest.mark.parametrize("vocab", [4096, 5000])
@pytest.mark.parametrize("budget", [64, 700])
def test_the_lists_are_whole_bins_down_to_the_mass_within_the_budget(
    vocab: int, budget: int
) -> None:
    logits, rows, temps, log_norms, targets = _case(vocab, seed=vocab + budget)
    q, ids, count = wide_list.wide_lists(logits, rows, temps, log_norms, targets, budget)
    assert q.shape == ids.shape == (ROWS, budget)
    for w in range(ROWS):
        row = logits[rows[w]].double()
        n = int(count[w])
        if torch.isnan(row).any():
            assert n == 0
            continue
        log_q = row * (1 / temps[w]) - log_norms[w]
        bins = ((log_q.max() - log_q) / LOG_Q_BIN).floor().clamp(max=NUM_LOG_Q_BINS - 1)
        per_bin = torch.bincount(bins.long(), minlength=NUM_LOG_Q_BINS)
        if per_bin[0] > budget:  # the flat row: its best bin alone is over the budget
            assert n == 0
            continue
        listed = ids[w, :n]
        assert len(set(listed.tolist())) == n <= budget
        assert (q[w, n:] == 0).all() and (ids[w, n:] == 0).all()
        torch.testing.assert_close(q[w, :n].double(), log_q[listed].exp(), rtol=1e-6, atol=0)
        last = int(bins[listed].max())
        assert n == int(per_bin[: last + 1].sum())  # whole bins, every one up to the last
        # listed in (bin, id) order
        key = bins[listed] * (vocab + 1) + listed.double()
        assert (key[1:] > key[:-1]).all()
        mass = log_q[listed].exp().sum()
        before_last = log_q[bins < last].exp().sum()
        assert before_last < targets[w]  # no whole bin more than it takes
        later = per_bin[last + 1 :]
        later = later[later > 0]  # the next bin with tokens in it, if any
        next_fits = bool(len(later)) and n + int(later[0]) <= budget
        assert mass >= targets[w] * (1 - 1e-12) or not next_fits  # the mass, or the budget


@pytest.mark.skipif(native.kernels() is None, reason="the native kernels are not built here")
@pytest.mark.parametrize("vocab", [4096, 5000])
@pytest.mark.parametrize("budget", [64, 700, 5000])
@pytest.mark.parametrize("avx512", ["1", "0"])  # the fitting tokens packed 16 or 8 at a time
def test_the_c_kernel_and_torch_list_the_same(
    monkeypatch: pytest.MonkeyPatch, vocab: int, budget: int, avx512: str
) -> None:
    monkeypatch.setenv("SPECCTL_AVX512", avx512)
    case = _case(vocab, seed=3 * vocab + budget)
    case[-1][2] = 0.999  # a target of 1 is a tie the float32 exps' last bits decide
    width = min(budget, vocab)
    got = wide_list._native(native.kernels(), *case, width)
    want = wide_list._torch(*case, width)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])  # ids, counts
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)  # exps within 2 ulp
    assert int(got[2].max()) > 0


def test_tokens_the_draft_cannot_draw_are_listed_with_q_zero() -> None:
    """A mass it cannot reach lists every bin the budget holds, the -inf logits' last one too:
    at q exactly 0 (the C kernel's exp clamps its inputs: its floor must still be 0)."""
    logits = torch.randn(2, 256, generator=torch.Generator().manual_seed(5))
    logits[:, 1::2] = -math.inf
    rows, temps = torch.tensor([0, 1]), torch.tensor([1.0, 0.7], dtype=torch.float64)
    log_norms = torch.logsumexp(logits.double() / temps.unsqueeze(-1), dim=-1)
    targets = torch.full((2,), 1.5, dtype=torch.float64)
    q, ids, count = wide_list.wide_lists(logits, rows, temps, log_norms, targets, 256)
    assert count.tolist() == [256, 256]
    impossible = logits.gather(-1, ids) == -math.inf  # [2, 256]
    assert impossible.sum() == 256 and (q[impossible] == 0).all() and (q[~impossible] > 0).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("vocab", [5000, 151936])
def test_the_torch_path_on_cuda_lists_what_it_lists_on_the_cpu(vocab: int) -> None:
    """The widened lists of CUDA logits (the torch sort on the device) against the same path on
    the host: the same ids and counts."""
    case = _case(vocab, seed=vocab)
    case[-1][2] = 0.999  # away from the exps' last-bit tie (as above)
    cuda_case = (case[0].cuda(), *case[1:])
    got = wide_list.wide_lists(*cuda_case, 2048)
    want = wide_list._torch(*case, min(2048, vocab))
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)
    assert int(got[2].max()) > 0


@pytest.mark.parametrize("native_on", ["1", "0"])
def test_a_row_outside_the_logits_is_an_index_error(
    monkeypatch: pytest.MonkeyPatch, native_on: str
) -> None:
    monkeypatch.setenv(native.DISABLE_ENV, native_on)
    logits, rows, temps, log_norms, targets = _case(300, seed=1)
    for bad in (ROWS, -ROWS - 1):
        bad_rows = rows.clone()
        bad_rows[2] = bad
        with pytest.raises(IndexError):
            wide_list.wide_lists(logits, bad_rows, temps, log_norms, targets, 64)
