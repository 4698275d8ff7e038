"""The Gumbel field's argmax in C (_cpu_kernels.c) picks the token the torch search and the
dense field pick: every key, ragged vocabularies, temperatures, rows of a larger tensor,
excluded tokens, rows of -inf, and a NaN handed back to the torch search."""

import math
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from daemon.runtime.model import native
from daemon.runtime.sampling import block_maxima
from daemon.runtime.sampling.gumbel_field import dense_field, field_keys, gumbel_argmax

pytestmark = pytest.mark.skipif(native.kernels() is None, reason="native kernels not built")


@pytest.fixture(autouse=True)
def _empty_registry() -> Iterator[None]:
    block_maxima.clear()
    yield
    block_maxima.clear()


def _both(monkeypatch: pytest.MonkeyPatch, *args: object, **kwargs: object) -> torch.Tensor:
    """gumbel_argmax in C and in torch; asserts they agree and returns the answer."""
    monkeypatch.setenv(native.DISABLE_ENV, "1")
    in_c = gumbel_argmax(*args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setenv(native.DISABLE_ENV, "0")
    in_torch = gumbel_argmax(*args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.delenv(native.DISABLE_ENV)
    assert torch.equal(in_c, in_torch)
    return in_c


def _record_maxima(logits: torch.Tensor) -> None:
    vocab = logits.shape[-1]
    blocks = -(-vocab // block_maxima.BLOCK)
    padded = F.pad(logits, (0, blocks * block_maxima.BLOCK - vocab), value=-math.inf)
    block_maxima.remember(logits, padded.view(logits.shape[0], blocks, -1).amax(dim=-1))


@pytest.mark.parametrize("vocab", [1, 63, 64, 65, 64 * 16, 64 * 16 + 1, 64 * 37 + 5, 151_936])
@pytest.mark.parametrize("spread", [0.01, 1.0, 8.0])
def test_the_c_search_is_the_torch_search(
    monkeypatch: pytest.MonkeyPatch, vocab: int, spread: float
) -> None:
    """Whole and partial blocks, fewer blocks than one vector pass (16) and many; logits flat
    and peaked; with the LM head's maxima and without."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(24, vocab, generator=gen) * spread  # [R, V]
    keys = field_keys(list(range(24)), [vocab] * 24)
    scale = torch.linspace(0.2, 1.5, 24)
    plain = _both(monkeypatch, logits, keys)
    scaled = _both(monkeypatch, logits, keys, noise_scale=scale)
    _record_maxima(logits)
    assert torch.equal(_both(monkeypatch, logits, keys), plain)
    assert torch.equal(_both(monkeypatch, logits, keys, noise_scale=scale), scaled)
    if vocab <= 64 * 37 + 5:  # the dense field, every entry drawn
        field = dense_field(keys, vocab)  # [R, V] float64
        assert torch.equal(plain, (logits.double() + field).argmax(dim=-1))
        assert torch.equal(scaled, (logits.double() + scale.double()[:, None] * field).argmax(-1))


def test_rows_excluded_tokens_and_rows_of_minus_infinity(monkeypatch: pytest.MonkeyPatch) -> None:
    vocab = 64 * 20 + 9
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(10, vocab, generator=gen) * 2
    logits[4] = -math.inf  # nothing to pick: -1
    logits[7, :] = -math.inf
    logits[7, vocab - 1] = 0.0  # only the last token of the partial block
    keys = field_keys(list(range(6)), [11] * 6)
    rows = torch.tensor([9, 4, 7, 0, 2, 5])
    picked = _both(monkeypatch, logits, keys, rows=rows)
    assert picked[1] == -1 and picked[2] == vocab - 1
    excluded = picked.view(6, 1).clamp(min=0)  # each key's winner excluded: another one wins
    again = _both(monkeypatch, logits[rows], keys, excluded)
    assert torch.all((again != picked) | (picked < 0))
    # strided rows of a larger tensor (row stride 2 V)
    wide = logits.repeat(1, 2).view(20, vocab)[::2]
    assert torch.equal(_both(monkeypatch, wide, keys, rows=rows), picked)


def test_a_nan_goes_to_the_torch_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C search gives up on a NaN score; the torch search then answers as it always did."""
    logits = torch.randn(3, 64 * 40)
    logits[1, 64 * 17 + 3] = math.nan
    keys = field_keys([1, 2, 3], [5, 5, 5])
    _both(monkeypatch, logits, keys)
    _record_maxima(logits)  # NaN among the maxima: the same
    _both(monkeypatch, logits, keys)


def test_rows_out_of_range_are_an_error() -> None:
    logits = torch.randn(2, 64 * 4)
    with pytest.raises(IndexError, match="out of range"):
        gumbel_argmax(logits, field_keys([1], [1]), rows=torch.tensor([2]))


@pytest.mark.parametrize("vocab", [1, 65, 64 * 16 + 1, 64 * 37 + 5, 151_936])
def test_probabilities_race_their_logs(monkeypatch: pytest.MonkeyPatch, vocab: int) -> None:
    """are_probs: log p races (zeros never win, a row of zeros gives -1), in C as in torch
    and as over the dense field."""
    gen = torch.Generator().manual_seed(vocab + 1)
    probs = torch.softmax(torch.randn(12, vocab, generator=gen) * 3, dim=-1)  # [R, V]
    probs[3] = 0.0
    probs[5, : vocab // 2] = 0.0  # half the tokens impossible
    keys = field_keys(list(range(12)), [vocab] * 12)
    picked = _both(monkeypatch, probs, keys, are_probs=True)
    assert picked[3] == -1
    assert vocab == 1 or picked[5] >= vocab // 2
    excluded = picked.view(12, 1).clamp(min=0)
    without = _both(monkeypatch, probs, keys, excluded, are_probs=True)
    # with the probabilities' block maxima (what the C softmax leaves): the same tokens
    _record_maxima(probs)
    assert torch.equal(_both(monkeypatch, probs, keys, are_probs=True), picked)
    assert torch.equal(_both(monkeypatch, probs, keys, excluded, are_probs=True), without)
    block_maxima.clear()
    if vocab <= 64 * 37 + 5:
        dense = probs.double().log() + dense_field(keys, vocab)
        expected = torch.where(dense.amax(-1) > -math.inf, dense.argmax(-1), -1)
        assert torch.equal(picked, expected)


@pytest.mark.parametrize("vocab", [65, 64 * 37 + 5, 151_936])
@pytest.mark.parametrize("are_probs", [False, True])
def test_hints_leave_the_answer_as_it_was(
    monkeypatch: pytest.MonkeyPatch, vocab: int, are_probs: bool
) -> None:
    """A hinted token's value is offered first (the verifier hints its drafts): the answer,
    the runner-up, a token in the short last block or in the block holding the largest score,
    a token of probability 0, an excluded one, none or past the vocabulary all leave every
    key's token as the unhinted C search and the torch search pick it."""
    gen = torch.Generator().manual_seed(vocab + 7)
    logits = torch.randn(16, vocab, generator=gen) * torch.linspace(0.05, 4.0, 16)[:, None]
    scores = torch.softmax(logits, dim=-1) if are_probs else logits  # [R, V]
    if are_probs:
        scores[3, : vocab // 2] = 0.0
    keys = field_keys(list(range(16)), [vocab] * 16)
    scale = None if are_probs else torch.linspace(0.3, 1.2, 16)
    plain = _both(monkeypatch, scores, keys, are_probs=are_probs, noise_scale=scale)
    excluded = plain.view(16, 1).clamp(min=0)
    second = _both(monkeypatch, scores, keys, excluded, are_probs=are_probs, noise_scale=scale)
    top_token = scores.argmax(dim=-1)  # [R] in the block the search looks at first
    for hints in (
        plain,
        second,
        top_token,
        torch.full((16,), vocab - 1),
        torch.zeros(16, dtype=torch.long),
        torch.full((16,), -1),
        torch.full((16,), vocab + 5),
    ):
        hinted = gumbel_argmax(scores, keys, are_probs=are_probs, noise_scale=scale, hints=hints)
        assert torch.equal(hinted, plain)
        # the winner excluded and hinted: its masked value never wins
        again = gumbel_argmax(
            scores, keys, excluded, are_probs=are_probs, noise_scale=scale, hints=plain
        )
        assert torch.equal(again, second)
    _record_maxima(scores)  # with the LM head's maxima (the row prefetch reads them)
    assert torch.equal(
        gumbel_argmax(scores, keys, are_probs=are_probs, noise_scale=scale, hints=plain), plain
    )


def test_hints_on_chosen_rows_of_a_larger_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    vocab = 64 * 50
    logits = torch.randn(12, vocab, generator=torch.Generator().manual_seed(5)) * 2
    rows = torch.tensor([11, 0, 6, 3])
    keys = field_keys([9, 9, 9, 9], [1, 2, 3, 4])
    picked = _both(monkeypatch, logits, keys, rows=rows)
    assert torch.equal(picked, _both(monkeypatch, logits[rows], keys))
    assert torch.equal(gumbel_argmax(logits, keys, rows=rows, hints=picked.flip(0)), picked)
    with pytest.raises(IndexError, match=r"rows out of range for 12 rows of scores: 12"):
        gumbel_argmax(logits, keys, rows=torch.tensor([0, 12, 1, 2]))


@pytest.mark.parametrize("vocab", [64 * 300 + 17, 151_936])
@pytest.mark.parametrize("spread", [0.05, 1.0, 6.0])
def test_what_is_dropped_before_its_logs_never_wins(
    monkeypatch: pytest.MonkeyPatch, vocab: int, spread: float
) -> None:
    """The C search drops the blocks (and the entries of a block) whose noise could not lift
    them past the value found so far before it takes their logs, by bounds on exp (the C
    source's g_could_win, g_entries_could_win). Over 96 keys, logits near flat to peaked,
    temperatures from 0.02 to 30, with and without a hint (a hinted row opens every
    superblock that can beat the hint's value before it looks at a block), and over
    probabilities, it picks what the torch search and the dense field pick."""
    rows = 96
    gen = torch.Generator().manual_seed(vocab + int(spread * 100))
    logits = torch.randn(rows, vocab, generator=gen) * spread  # [R, V]
    keys = field_keys(list(range(rows)), [vocab + 3] * rows)
    scale = torch.logspace(math.log10(0.02), math.log10(30.0), rows)  # [R]
    _record_maxima(logits)
    scaled = _both(monkeypatch, logits, keys, noise_scale=scale)
    hinted = gumbel_argmax(logits, keys, noise_scale=scale, hints=scaled)
    wrong = gumbel_argmax(logits, keys, noise_scale=scale, hints=(scaled + 1) % vocab)
    assert torch.equal(hinted, scaled) and torch.equal(wrong, scaled)
    # float32 temperatures are read as float32 (each as a double), others converted: the same
    assert torch.equal(gumbel_argmax(logits, keys, noise_scale=scale.double()), scaled)
    strided = torch.stack([scale, scale], dim=-1)[:, 0]  # float32, not contiguous
    assert torch.equal(gumbel_argmax(logits, keys, noise_scale=strided), scaled)
    block_maxima.clear()
    probs = torch.softmax(logits * 2.0, dim=-1)
    picked = _both(monkeypatch, probs, keys, are_probs=True)
    assert torch.equal(gumbel_argmax(probs, keys, are_probs=True, hints=picked), picked)
    if vocab < 151_936:
        field = dense_field(keys, vocab)  # [R, V] float64
        expected = (logits.double() + scale.double()[:, None] * field).argmax(dim=-1)
        assert torch.equal(scaled, expected)
        assert torch.equal(picked, (probs.double().log() + field).argmax(dim=-1))


def test_runs_stop_after_a_miss_and_must_cover_the_keys() -> None:
    """With runs, a run's keys after its first answer that is not its hint are left -3 (a
    verifier reads none of them); runs that do not cover the keys are a ValueError."""
    vocab = 64 * 40 + 3
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(2)) * 2
    keys = field_keys([4] * 6, list(range(6)))
    plain = gumbel_argmax(logits, keys)
    hints = plain.clone()
    hints[1] = (plain[1] + 1) % vocab  # run 0 (keys 0-3) misses at its second key
    hints[3] = -1  # a bonus position: no hint
    stopped = gumbel_argmax(logits, keys, hints=hints, runs=[4, 0, 2])
    assert stopped.tolist() == [*plain[:2].tolist(), -3, -3, *plain[4:].tolist()]
    assert torch.equal(gumbel_argmax(logits, keys, hints=hints), plain)  # no runs: all
    with pytest.raises(ValueError, match="runs cover 5 keys of 6"):
        gumbel_argmax(logits, keys, hints=hints, runs=[4, 1])
    with pytest.raises(ValueError, match="runs must be >= 0"):
        gumbel_argmax(logits, keys, hints=hints, runs=[7, -1])
