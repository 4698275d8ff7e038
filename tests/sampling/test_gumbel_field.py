"""The keyed Gumbel field: its bits match the Python SplitMix64, its entries are Gumbel(0),
the block-by-block argmax equals the argmax over the dense field, and Gumbel-max over it is an
exact sample."""

import math

import pytest
import torch
from gumbel_cases import dense_argmax_case
from test_rejection_distribution import MIN_P_VALUE, chi_square_p

from daemon.runtime.model import native
from daemon.runtime.sampling.gumbel_field import (
    dense_field,
    field_key,
    field_key_run,
    field_key_runs,
    field_keys,
    gumbel_argmax,
    gumbel_topk,
    mix64_t,
)
from daemon.runtime.sampling.keyed_random import MASK64, mix64

EULER_GAMMA = 0.5772156649


def test_torch_mix_matches_the_python_one_on_every_bit() -> None:
    gen = torch.Generator().manual_seed(0)
    words = torch.randint(-(2**63), 2**63 - 1, (4096,), generator=gen, dtype=torch.int64)
    words = torch.cat([words, torch.tensor([0, -1, 2**63 - 1, -(2**63)])])
    got = mix64_t(words).tolist()
    expected = [mix64(w & MASK64) for w in words.tolist()]
    assert [g & MASK64 for g in got] == expected


def test_field_entries_are_standard_gumbel() -> None:
    field = dense_field(field_keys(list(range(64)), [5] * 64), 1000)  # [64, 1000]
    assert field.shape == (64, 1000)
    assert abs(float(field.mean()) - EULER_GAMMA) < 0.02
    # P(G <= 0) = exp(-1); P(G <= 2) = exp(-exp(-2))
    assert abs(float((field <= 0).double().mean()) - math.exp(-1)) < 0.01
    assert abs(float((field <= 2).double().mean()) - math.exp(-math.exp(-2))) < 0.01


def test_keys_differ_by_seed_and_position() -> None:
    assert len({field_key(s, p) for s in range(20) for p in range(20)}) == 400
    with pytest.raises(ValueError):
        field_key(1, -1)


@pytest.mark.parametrize("native_on", ["1", "0"])
def test_runs_of_keys_are_field_key_in_c_and_in_python(
    monkeypatch: pytest.MonkeyPatch, native_on: str
) -> None:
    """field_key_runs (in C where the kernels run) gives field_key's bits: seeds negative, past
    2^63 and past 2^64 (taken modulo 2^64, as Python's masks do), positions 0 and large,
    runs of 0, 1 and 5; a negative position or unequal lists are a ValueError."""
    monkeypatch.setenv(native.DISABLE_ENV, native_on)
    seeds = [0, 1, -5, 2**63 + 3, 2**64 + 7, -(2**70), 123456789]
    starts = [0, 7, 3, 2**40, 11, 0, 99]
    counts = [5, 1, 0, 5, 2, 3, 1]
    runs = zip(seeds, starts, counts, strict=True)
    expected = [field_key(s, p + c) for s, p, n in runs for c in range(n)]
    assert field_key_runs(seeds, starts, counts).tolist() == expected
    singles = [field_key(s, p) for s, p in zip(seeds, starts, strict=True)]
    assert field_keys(seeds, starts).tolist() == singles
    assert field_key_run(seeds[3], starts[3], 5) == expected[6:11]
    with pytest.raises(ValueError, match="position must be >= 0"):
        field_key_runs([1, 2], [3, -1], [1, 1])
    with pytest.raises(ValueError, match="counts must be >= 0"):
        field_key_runs([1, 2], [3, 4], [1, -1])
    with pytest.raises(ValueError):
        field_keys([1, 2], [3])


@pytest.mark.parametrize("vocab", [40, 64, 1000, 4096, 5003])
@pytest.mark.parametrize("are_probs", [False, True])
def test_block_search_equals_the_dense_argmax(vocab: int, are_probs: bool) -> None:
    case = dense_argmax_case(vocab, rows=24, are_probs=are_probs, seed=vocab)
    got = gumbel_argmax(case.scores.clone(), case.keys, case.excluded, are_probs=are_probs)
    assert got.tolist() == case.expected.tolist()
    assert int(got[4]) == -1


def test_gumbel_max_over_the_field_samples_the_distribution() -> None:
    gen = torch.Generator().manual_seed(2)
    p = torch.softmax(torch.randn(40, generator=gen) * 1.5, -1)  # [V]
    draws = 20_000
    keys = field_keys([7] * draws, list(range(draws)))
    tokens = gumbel_argmax(p.expand(draws, -1).clone(), keys, are_probs=True)
    assert chi_square_p(tokens, p) > MIN_P_VALUE
    # excluding tokens samples p restricted to the rest
    excluded = p.topk(5).indices
    tokens = gumbel_argmax(
        p.expand(draws, -1).clone(), keys, excluded.expand(draws, -1), are_probs=True
    )
    rest = p.clone()
    rest[excluded] = 0.0
    assert chi_square_p(tokens, rest / rest.sum()) > MIN_P_VALUE


def test_shared_noise_couples_close_distributions() -> None:
    """Drafter and verifier maximise against their own distributions with the same noise:
    equal distributions always agree, close ones mostly, independent draws rarely."""
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(2000, generator=gen)
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits + 0.3 * torch.randn(2000, generator=gen), -1)
    draws = 4000
    keys = field_keys(list(range(draws)), [3] * draws)
    from_p = gumbel_argmax(p.expand(draws, -1).clone(), keys, are_probs=True)
    assert torch.equal(from_p, gumbel_argmax(p.expand(draws, -1).clone(), keys, are_probs=True))
    agree = float(
        (from_p == gumbel_argmax(q.expand(draws, -1).clone(), keys, are_probs=True)).double().mean()
    )
    overlap = float(torch.minimum(p, q).sum())
    # Gumbel coupling: at least (1 - tv) / (1 + tv), at most the overlap 1 - tv
    assert (overlap / (2 - overlap)) - 0.03 < agree <= overlap + 0.03
    assert agree > 10 * float((p * q).sum())


def test_rows_of_a_larger_tensor_and_the_scores_left_as_they_were() -> None:
    gen = torch.Generator().manual_seed(6)
    scores = torch.softmax(torch.randn(10, 700, generator=gen) * 2, -1)  # [R, V]
    before = scores.clone()
    rows = torch.tensor([7, 2, 5])
    keys = field_keys([1, 2, 3], [4, 4, 4])
    excluded = scores[rows].topk(6).indices  # [3, 6]
    got = gumbel_argmax(scores, keys, excluded, are_probs=True, rows=rows)
    assert torch.equal(scores, before)
    expected = gumbel_argmax(scores[rows].clone(), keys, excluded, are_probs=True)
    assert got.tolist() == expected.tolist()
    assert not set(got.tolist()) & set(excluded.flatten().tolist())
    with pytest.raises(ValueError, match="keys"):
        gumbel_argmax(scores, keys)


def test_many_blocks_entries_are_gumbel_and_gumbel_max_samples_across_them() -> None:
    vocab = 9000  # 141 blocks, the last one short
    field = dense_field(field_keys(list(range(16)), [9] * 16), vocab)  # [16, V]
    assert abs(float(field.mean()) - EULER_GAMMA) < 0.02
    assert abs(float((field <= 0).double().mean()) - math.exp(-1)) < 0.01
    # the largest entry of each row is Gumbel(log V): P(max <= log V) = exp(-1)
    maxima = dense_field(field_keys(list(range(3000)), [1] * 3000), vocab).amax(-1)
    assert abs(float((maxima <= math.log(vocab)).double().mean()) - math.exp(-1)) < 0.03
    # tokens in different blocks and groups, sampled in proportion
    logits = torch.full((vocab,), -4.0)
    favoured = torch.tensor([5, 70, 4100, 8191, 8999])
    logits[favoured] = torch.tensor([1.0, 0.5, 0.0, 1.5, -0.5])
    p = torch.softmax(logits, -1)
    draws = 6000
    keys = field_keys([3] * draws, list(range(draws)))
    tokens = gumbel_argmax(logits.expand(draws, -1).clone(), keys)
    cells = torch.full((vocab,), favoured.numel(), dtype=torch.long)  # the rest pooled
    cells[favoured] = torch.arange(favoured.numel())
    expected = torch.cat([p[favoured], (1 - p[favoured].sum()).view(1)])
    assert chi_square_p(cells[tokens], expected) > MIN_P_VALUE


def test_superblocks_and_their_blocks_hold_independent_gumbel_maxima() -> None:
    """The field is drawn top down (superblocks of SUPER blocks, then blocks, then entries): a
    superblock's and a block's largest entries are Gumbel(log n), where the row's largest sits
    is uniform over the tokens, and the maxima of neighbouring blocks and superblocks are
    independent. 2 superblocks of 2,048 tokens and a third of one short block (37 tokens)."""
    from daemon.runtime.sampling.gumbel_field import BLOCK, SUPER

    span = SUPER * BLOCK
    vocab = 2 * span + 37
    draws = 2000
    field = dense_field(field_keys(list(range(draws)), [17] * draws), vocab)  # [draws, V]
    blocks = field[:, : 2 * span].reshape(draws, -1, BLOCK).amax(-1)  # [draws, 64] whole blocks
    supers = field[:, : 2 * span].reshape(draws, 2, span).amax(-1)  # [draws, 2]
    last = field[:, 2 * span :].amax(-1)  # [draws] the short block, its own superblock
    # P(max of n Gumbel(0) <= log n) = exp(-1)
    for maxima, n, tolerance in ((blocks, BLOCK, 0.005), (supers, span, 0.02), (last, 37, 0.03)):
        share = float((maxima <= math.log(n)).double().mean())
        assert abs(share - math.exp(-1)) < tolerance, (n, share)
    # neighbouring blocks of one superblock, and the two superblocks: uncorrelated
    for a, b in ((blocks[:, 0], blocks[:, 1]), (blocks[:, 31], blocks[:, 32]), supers.T):
        assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 0.08
    # the row's largest entry: in each superblock in proportion to its tokens, and anywhere
    # within a block alike
    where = field.argmax(-1)  # [draws]
    cell = torch.clamp(where // span, max=2)
    assert chi_square_p(cell, torch.tensor([span, span, 37.0]) / vocab) > MIN_P_VALUE
    in_block = where[where < 2 * span] % BLOCK
    assert chi_square_p(in_block // 8, torch.full((8,), 1 / 8)) > MIN_P_VALUE


def test_scores_made_under_inference_mode_are_searched_and_restored() -> None:
    with torch.inference_mode():
        scores = torch.softmax(torch.randn(4, 300, generator=torch.Generator().manual_seed(8)), -1)
    before = scores.clone()
    keys = field_keys([1, 2, 3, 4], [0, 0, 0, 0])
    excluded = torch.tensor([[0, 1, 0], [2, -1, 2], [-1, -1, -1], [5, 6, 5]])  # ids repeated
    got = gumbel_argmax(scores, keys, excluded, are_probs=True)
    assert torch.equal(scores, before)
    assert got.tolist() == gumbel_argmax(before.clone(), keys, excluded, are_probs=True).tolist()


@pytest.mark.parametrize("vocab", [64, 1000, 5003])
def test_noise_scale_equals_the_dense_argmax_at_that_temperature(vocab: int) -> None:
    """argmax (scores + s G) without dividing: the dense argmax of scores + s G, which is the
    argmax of scores / s + G (logits at temperature s)."""
    gen = torch.Generator().manual_seed(vocab + 1)
    rows = 24
    logits = torch.randn(rows, vocab, generator=gen) * 4
    logits[3, ::2] = -math.inf
    scale = 0.2 + 1.5 * torch.rand(rows, generator=gen)  # temperatures
    keys = field_keys(list(range(rows)), [3 * r for r in range(rows)])
    total = logits.double() + scale.double().unsqueeze(-1) * dense_field(keys, vocab)
    got = gumbel_argmax(logits.clone(), keys, noise_scale=scale)
    assert got.tolist() == total.argmax(-1).tolist()
    divided = gumbel_argmax(logits / scale.unsqueeze(-1), keys)
    assert (got == divided).float().mean() > 0.99  # the same up to rounding near ties
    with pytest.raises(ValueError, match="noise_scale"):
        gumbel_argmax(torch.softmax(logits, -1), keys, are_probs=True, noise_scale=scale)


@pytest.mark.parametrize("vocab", [5, 64, 1000, 5003])
@pytest.mark.parametrize("num", [1, 3, 70])
def test_topk_is_the_dense_ranking_and_starts_with_the_argmax(vocab: int, num: int) -> None:
    """gumbel_topk: the num best of scores + s G over the dense field, best first, -1 past
    the finite scores; its first is gumbel_argmax's token; the scores are left as they were."""
    num = min(num, vocab)
    gen = torch.Generator().manual_seed(vocab * 7 + num)
    rows = 12
    logits = torch.randn(rows, vocab, generator=gen) * 3
    logits[0, : vocab - 2] = -math.inf  # two finite scores only
    logits[1] = -math.inf  # none
    before = logits.clone()
    scale = 0.2 + 1.5 * torch.rand(rows, generator=gen)
    keys = field_keys(list(range(rows)), [11 * r for r in range(rows)])
    got = gumbel_topk(logits, keys, num, noise_scale=scale)
    total = logits.double() + scale.double().unsqueeze(-1) * dense_field(keys, vocab)
    values, ids = total.topk(num, dim=-1)
    assert got.tolist() == torch.where(values > -math.inf, ids, -1).tolist()
    assert got[:, 0].tolist() == gumbel_argmax(logits, keys, noise_scale=scale).tolist()
    assert torch.equal(logits, before)
    with pytest.raises(ValueError, match="num"):
        gumbel_topk(logits, keys, vocab + 1)


@pytest.mark.parametrize("native_on", ["1", "0"])
def test_excluded_ids_past_the_vocabulary_or_misshapen_are_refused(
    monkeypatch: pytest.MonkeyPatch, native_on: str
) -> None:
    """Both searches (the C one masks each key's tokens itself): an id past V is an
    IndexError, a list per key that is not [N, S] a ValueError; the scores stay as they were."""
    monkeypatch.setenv(native.DISABLE_ENV, native_on)
    scores = torch.softmax(torch.randn(3, 300, generator=torch.Generator().manual_seed(9)), -1)
    before = scores.clone()
    keys = field_keys([1, 2, 3], [0, 0, 0])
    with pytest.raises(IndexError):
        gumbel_argmax(scores, keys, torch.tensor([[0, 1], [300, -1], [-1, -1]]), are_probs=True)
    with pytest.raises(ValueError, match="excluded"):
        gumbel_argmax(scores, keys, torch.tensor([[0, 1], [2, -1]]), are_probs=True)
    assert torch.equal(scores, before)
