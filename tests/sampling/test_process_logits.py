"""process_logits (temperature, top-k, top-p) and sparse_top_k on hand-made logits."""

import math

import pytest
import torch
import torch.nn.functional as F

from daemon.runtime.model import native
from daemon.runtime.sampling import block_maxima
from daemon.runtime.sampling.logits import process_logits, softmax_at_temperatures_, sparse_top_k

# probabilities 0.4, 0.3, 0.2, 0.1 at temperature 1, in a shuffled vocabulary order
LOGITS = torch.tensor([[math.log(0.2), math.log(0.4), math.log(0.1), math.log(0.3)]])


def process(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    return process_logits(
        LOGITS,
        torch.tensor([temperature]),
        torch.tensor([top_k], dtype=torch.long),
        torch.tensor([top_p]),
    )[0]


def test_no_truncation_is_softmax() -> None:
    torch.testing.assert_close(process(), torch.tensor([0.2, 0.4, 0.1, 0.3]))


def test_temperature_sharpens_and_flattens() -> None:
    cold, hot = process(temperature=0.5), process(temperature=4.0)
    # p^(1/T), renormalised
    expected_cold = torch.tensor([0.04, 0.16, 0.01, 0.09]) / 0.30
    torch.testing.assert_close(cold, expected_cold)
    assert hot.max() < 0.4 < cold.max()


def test_greedy_row_is_softmax_at_temperature_one() -> None:
    greedy = process(temperature=0.0)
    torch.testing.assert_close(greedy, process())
    assert greedy.argmax() == LOGITS.argmax()


def test_top_k_keeps_k_most_likely() -> None:
    torch.testing.assert_close(process(top_k=2), torch.tensor([0.0, 0.4, 0.0, 0.3]) / 0.7)
    torch.testing.assert_close(process(top_k=1), torch.tensor([0.0, 1.0, 0.0, 0.0]))
    torch.testing.assert_close(process(top_k=10), process())  # k >= V: off


def test_top_p_keeps_smallest_prefix_reaching_p() -> None:
    # 0.4 < 0.5 so the second token is needed; 0.4 + 0.3 = 0.7 >= 0.5 stops there
    torch.testing.assert_close(process(top_p=0.5), torch.tensor([0.0, 0.4, 0.0, 0.3]) / 0.7)
    torch.testing.assert_close(process(top_p=0.75), torch.tensor([0.2, 0.4, 0.0, 0.3]) / 0.9)
    # tiny top_p still keeps the most likely token
    torch.testing.assert_close(process(top_p=1e-6), torch.tensor([0.0, 1.0, 0.0, 0.0]))


def test_top_k_then_top_p() -> None:
    # top-k 3 renormalises to 4/9, 3/9, 2/9; top-p 0.6 then keeps 4/9 + 3/9
    torch.testing.assert_close(
        process(top_k=3, top_p=0.6), torch.tensor([0.0, 0.4, 0.0, 0.3]) / 0.7
    )
    # mass before the third is 7/9 < 0.8, so top-p 0.8 keeps all three top-k tokens
    torch.testing.assert_close(
        process(top_k=3, top_p=0.8), torch.tensor([0.2, 0.4, 0.0, 0.3]) / 0.9
    )


def test_rows_are_independent() -> None:
    logits = LOGITS.expand(3, -1)
    probs = process_logits(
        logits,
        torch.tensor([1.0, 0.0, 2.0]),
        torch.tensor([2, 0, 0]),
        torch.tensor([1.0, 1.0, 0.5]),
    )
    torch.testing.assert_close(probs[0], process(top_k=2))
    torch.testing.assert_close(probs[1], process())
    torch.testing.assert_close(probs[2], process(temperature=2.0, top_p=0.5))
    torch.testing.assert_close(probs.sum(-1), torch.ones(3))


def test_bad_shapes_raise() -> None:
    with pytest.raises(ValueError, match="top_k"):
        process_logits(LOGITS, torch.ones(1), torch.zeros(2, dtype=torch.long), torch.ones(1))
    with pytest.raises(ValueError, match="logits"):
        process_logits(LOGITS[0], torch.ones(1), torch.zeros(1, dtype=torch.long), torch.ones(1))


def test_sparse_top_k_renormalises() -> None:
    probs = process_logits(
        torch.randn(5, 16, generator=torch.Generator().manual_seed(0)),
        torch.ones(5),
        torch.zeros(5, dtype=torch.long),
        torch.ones(5),
    )
    ids, sparse = sparse_top_k(probs, 4)
    assert ids.shape == sparse.shape == (5, 4) and ids.dtype == torch.int64
    torch.testing.assert_close(sparse.sum(-1), torch.ones(5))
    # the ids are the 4 most likely, in order, with the original ratios
    torch.testing.assert_close(ids, probs.topk(4, dim=-1).indices)
    ratio = probs.gather(-1, ids) / sparse
    torch.testing.assert_close(ratio, ratio[:, :1].expand(-1, 4))
    with pytest.raises(ValueError):
        sparse_top_k(probs, 17)


@pytest.mark.parametrize("native_on", ["1", "0"])
@pytest.mark.parametrize("vocab", [1, 9, 64, 64 * 37 + 5, 151_936])
def test_in_place_equals_the_fresh_softmax(
    monkeypatch: pytest.MonkeyPatch, native_on: str, vocab: int
) -> None:
    """In place (the C kernel where it runs, the LM head's block maxima or not) gives the
    softmax at each row's temperature (greedy: 1), as close to float64's as torch's own."""
    monkeypatch.setenv(native.DISABLE_ENV, native_on)
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=gen) * torch.tensor([0.1, 1, 5, 20, 3])[:, None]
    temps = torch.tensor([0.0, 0.3, 0.7, 1.0, 1.7])
    no_k, no_p = torch.zeros(5, dtype=torch.long), torch.ones(5)
    at = torch.where(temps > 0, temps, 1.0).double()  # greedy rows: temperature 1
    exact = torch.softmax(logits.double() / at[:, None], dim=-1)
    fresh = process_logits(logits, temps, no_k, no_p)
    torch.testing.assert_close(fresh.double(), exact, rtol=5e-5, atol=1e-12)
    for with_maxima in (False, True):
        work = logits.clone()
        if with_maxima:
            blocks = -(-vocab // 64)
            padded = F.pad(work, (0, blocks * 64 - vocab), value=-math.inf)
            block_maxima.remember(work, padded.view(5, blocks, 64).amax(dim=-1))
        got = process_logits(work, temps, no_k, no_p, inplace=True)
        assert got.data_ptr() == work.data_ptr()
        torch.testing.assert_close(got.double(), exact, rtol=5e-5, atol=1e-12)
        # the logits' maxima are gone; the C kernel leaves the probabilities' own
        found = block_maxima.lookup(work)
        if native_on == "1" and native.kernels() is not None:
            blocks = -(-vocab // 64)
            padded = F.pad(got, (0, blocks * 64 - vocab), value=-math.inf)
            assert found is not None
            assert torch.equal(found, padded.view(5, blocks, 64).amax(dim=-1))
        else:
            assert found is None
        block_maxima.clear()


@pytest.mark.parametrize("native_on", ["1", "0"])
def test_in_place_rows_without_a_finite_max(
    monkeypatch: pytest.MonkeyPatch, native_on: str
) -> None:
    """A row of -inf, a NaN or +inf: the same answer as torch's softmax (the C kernel leaves
    such batches to it)."""
    monkeypatch.setenv(native.DISABLE_ENV, native_on)
    logits = torch.randn(4, 300)
    logits[1] = -math.inf
    logits[2, 7] = math.nan
    logits[3, 9] = math.inf
    args = (torch.ones(4), torch.zeros(4, dtype=torch.long), torch.ones(4))
    expected = torch.softmax(logits, dim=-1)
    got = process_logits(logits.clone(), *args, inplace=True)
    torch.testing.assert_close(got, expected, equal_nan=True)


@pytest.mark.parametrize("native_on", ["1", "0"])
def test_softmax_at_temperatures_is_process_logits_in_place(
    monkeypatch: pytest.MonkeyPatch, native_on: str
) -> None:
    """The verifier's shortcut for rows that do not truncate: the same bits as process_logits
    in place where the C softmax runs (block maxima left as it leaves them); False, the
    logits untouched, where it does not (the kernels off, a row without a finite max, a
    strided view)."""
    monkeypatch.setenv(native.DISABLE_ENV, native_on)
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(6, 4096, generator=gen) * 4
    temps = [0.0, 0.3, 0.7, 1.0, 1.7, 0.7]  # 0: greedy, the softmax at 1
    expected = process_logits(
        logits.clone(), torch.tensor(temps), torch.zeros(6, dtype=torch.long), torch.ones(6),
        inplace=True,
    )  # fmt: skip
    block_maxima.clear()
    work = logits.clone()
    ran = softmax_at_temperatures_(work, temps)
    assert ran == (native_on == "1" and native.kernels() is not None)
    assert torch.equal(work, expected if ran else logits)
    assert (block_maxima.lookup(work) is not None) == ran
    block_maxima.clear()
    bad = logits.clone()
    bad[2, 5] = math.nan
    assert not softmax_at_temperatures_(bad, temps)
    assert torch.equal(bad[:2], logits[:2])
    wide = torch.cat([logits, logits], dim=-1)
    assert not softmax_at_temperatures_(wide[:, :4096], temps)  # rows not contiguous
    assert not softmax_at_temperatures_(logits.clone(), temps[:5])  # a temperature short
