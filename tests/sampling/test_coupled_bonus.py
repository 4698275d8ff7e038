"""The bonus token of a sampled row is the Gumbel-max of its position's shared field: still an
exact sample of the target (chi-square on the first two emitted tokens of one-draft rounds,
where the second is the bonus whenever the draft is accepted), the very token the field picks,
and the drafter's coupled guess of it is right whenever the two distributions are the same."""

import pytest
import torch

from daemon.runtime.proposers.draft_sampling import DraftSampler, RowKey
from daemon.runtime.sampling.coupled_bonus import couple_bonus_tokens
from daemon.runtime.sampling.dispatch import rejection_sample_for_device
from daemon.runtime.sampling.gumbel_field import dense_field, field_keys, gumbel_argmax
from daemon.runtime.sampling.inverse_cdf import sample_inverse_cdf
from daemon.runtime.sampling.logits import sparse_top_k
from daemon.runtime.sampling.random import (
    emit_uniforms,
    make_generators,
    sample_sparse,
    uniform_noise,
)
from daemon.runtime.sampling.rejection import rejection_sample
from tests.sampling.test_rejection_distribution import (
    MIN_P_VALUE,
    NUM_ROWS,
    VOCAB,
    chi_square_p,
    draft_tables,
    target_tables,
)


def test_bonus_from_the_field_follows_the_target() -> None:
    seed = 11
    gen = torch.Generator().manual_seed(seed)
    p0, p1, _ = target_tables(gen, truncate=False)
    q0, _ = draft_tables(gen)
    gens = make_generators([seed * NUM_ROWS + row for row in range(NUM_ROWS)])
    ids0, sp0 = sparse_top_k(q0.expand(NUM_ROWS, -1), 4)  # [N, S]
    x0 = sample_sparse(ids0, sp0, gens)  # [N] one draft per row
    draft_seeds = list(range(NUM_ROWS))
    bonus_keys = field_keys(draft_seeds, [1] * NUM_ROWS)  # the bonus sits at position 1
    num_draft = torch.ones(NUM_ROWS, dtype=torch.long)
    target_probs = torch.stack([p0.expand(NUM_ROWS, -1), p1[x0]], dim=1)  # [N, 2, V]
    out, num = rejection_sample_for_device(
        x0.unsqueeze(1), num_draft, ids0.unsqueeze(1), sp0.unsqueeze(1), target_probs,
        torch.zeros(NUM_ROWS, dtype=torch.bool), uniform_noise(gens, [1] * NUM_ROWS, 1),
        emit_uniforms(gens), bonus_keys=bonus_keys,
    )  # fmt: skip
    bonus = num == 2
    assert 0.1 < float(bonus.float().mean()) < 0.95  # both verdicts occur
    # the bonus is the field's own pick over p at position 1
    picked = gumbel_argmax(p1[x0[bonus]].clone(), bonus_keys[bonus], are_probs=True)
    assert torch.equal(out[bonus, 1], picked)
    t0 = out[:, 0]
    next_token = sample_inverse_cdf(p1[t0], emit_uniforms(gens))  # the next round's token
    t1 = torch.where(bonus, out[:, 1], next_token)
    assert chi_square_p(t0, p0) > MIN_P_VALUE
    joint = (p0.unsqueeze(-1) * p1).flatten()
    assert chi_square_p(t0 * VOCAB + t1, joint) > MIN_P_VALUE


def test_greedy_rows_and_rejections_keep_their_tokens() -> None:
    probs = torch.softmax(torch.randn(3, 2, VOCAB, generator=torch.Generator().manual_seed(2)), -1)
    output = torch.tensor([[4, 7], [5, -1], [6, 9]])
    num_output = torch.tensor([2, 1, 2])  # row 1 stopped at its draft: a correction
    num_draft = torch.tensor([1, 1, 1])
    is_greedy = torch.tensor([True, False, False])
    keys = field_keys([1, 2, 3], [5, 5, 5])
    couple_bonus_tokens(output, num_output, num_draft, probs, is_greedy, keys)
    assert output[0].tolist() == [4, 7] and output[1].tolist() == [5, -1]
    expected = gumbel_argmax(probs[2, 1:].clone(), keys[2:], are_probs=True)
    assert output[2].tolist() == [6, int(expected)]


def test_drafter_guess_is_the_bonus_when_draft_equals_target() -> None:
    gen = torch.Generator().manual_seed(8)
    num_rows, vocab, temperature = 64, 1000, 1.0
    logits = torch.randn(num_rows, vocab, generator=gen) * 2.0
    keys = [RowKey(temperature, draft_seed=100 + r, position=17 + r) for r in range(num_rows)]
    ids, probs = DraftSampler(sparse_top_k=32).guesses(logits.clone(), keys, num=3)
    # the verifier: p = softmax(logits / T), every row's single draft accepted -> bonus at 1
    target = torch.softmax(logits / temperature, dim=-1)
    target_probs = torch.stack([target, target], dim=1)  # [R, 2, V]
    output = torch.full((num_rows, 2), -1, dtype=torch.long)
    bonus_keys = field_keys([k.draft_seed for k in keys], [k.position for k in keys])
    couple_bonus_tokens(
        output, torch.full((num_rows,), 2), torch.ones(num_rows, dtype=torch.long),
        target_probs, torch.zeros(num_rows, dtype=torch.bool), bonus_keys,
    )  # fmt: skip
    assert [row[0] for row in ids] == output[:, 1].tolist()
    likeliest = target.argmax(-1).tolist()
    assert sum(row[0] == best for row, best in zip(ids, likeliest, strict=True)) < num_rows / 2
    for row, row_probs, dist in zip(ids, probs, target, strict=True):
        assert len(row) == 3 and len(set(row)) == 3  # the coupled guess, then two others
        assert abs(row_probs[0] - float(dist[row[0]])) < 1e-5


def test_coupled_alternatives_are_the_race_and_catch_the_verifiers_correction() -> None:
    """Coupled drafting (sparse_top_k 0) with alternatives: a sampled row's draft is the race's
    winner argmax (log q + G) and its alternatives the race's order (the dense ranking). Where
    the verifier's own draw argmax (log p + G) differs (p near q), it is a runner-up of that
    race far more often than one of the draft's likeliest tokens: the guesses for a correction
    (and the bonus, `guesses`) are the runners-up."""
    gen = torch.Generator().manual_seed(21)
    num_rows, vocab, temperature = 400, 1000, 1.0
    logits = torch.randn(num_rows, vocab, generator=gen) * 2.0  # the draft's
    target = logits + torch.randn(num_rows, vocab, generator=gen) * 0.5  # the verifier's
    keys = [RowKey(temperature, draft_seed=5 + r, position=30 + r) for r in range(num_rows)]
    field = field_keys([k.draft_seed for k in keys], [k.position for k in keys])
    sampler = DraftSampler(sparse_top_k=0, num_alternatives=3)
    steps = sampler.sample(logits.clone(), keys, with_alternatives=True)
    race = logits.double() / temperature + dense_field(field, vocab)  # [R, V]
    assert [s.alternatives for s in steps] == race.topk(3, dim=-1).indices.tolist()
    assert all(s.token == s.alternatives[0] and s.sparse is None for s in steps)
    q = torch.softmax(logits / temperature, dim=-1)
    for step, dist in zip(steps, q, strict=True):
        expected = [float(dist[t]) for t in step.alternatives]
        assert step.alternative_probs == pytest.approx(expected, rel=1e-5)
    assert sampler.guesses(logits.clone(), keys, 3)[0] == [s.alternatives for s in steps]
    verifier = gumbel_argmax(target / temperature, field).tolist()
    likeliest = logits.topk(3, dim=-1).indices.tolist()
    missed = [r for r, s in enumerate(steps) if s.token != verifier[r]]
    assert len(missed) > 40  # enough corrections to compare
    by_race = sum(verifier[r] in steps[r].alternatives[1:] for r in missed)
    by_likeliest = sum(verifier[r] in likeliest[r] for r in missed)
    assert by_race > 1.5 * by_likeliest, (by_race, by_likeliest, len(missed))


def test_the_sampler_settles_the_bonus_itself_exactly_as_replacing_it_after() -> None:
    """With bonus keys the torch sampler skips the residual where a token is already decided
    (a sampled row's coupled bonus, a matched draft's own y); every token must be the one
    sampling everything and then replacing the bonus gives. A mixed batch: greedy rows,
    listed drafts with and without a tail, point-mass drafts (matched), 0..K drafts."""
    gen = torch.Generator().manual_seed(5)
    rows, max_k, vocab, listed = 96, 3, 300, 4
    probs = torch.softmax(torch.randn(rows, max_k + 1, vocab, generator=gen) * 3.0, -1)
    best = probs.argmax(-1)  # [B, K+1] peaky rows: drafts of the argmax are mostly accepted
    noise = torch.randint(0, vocab, (rows, max_k), generator=gen)
    likely = torch.rand(rows, 1, generator=gen) < 0.7
    drafts = torch.where(likely, best[:, :max_k], noise)
    num_draft = torch.randint(0, max_k + 1, (rows,), generator=gen)
    drafts = torch.where(torch.arange(max_k) < num_draft.unsqueeze(-1), drafts, -1)
    sparse_ids = torch.randint(0, vocab, (rows, max_k, listed), generator=gen)
    sparse_ids[..., 0] = drafts.clamp(min=0)
    sparse_ids[..., 1:] = (sparse_ids[..., 1:] + 1 + drafts.clamp(min=0).unsqueeze(-1)) % vocab
    sparse_probs = torch.rand(rows, max_k, listed, generator=gen) * 0.2
    kind = torch.randint(0, 3, (rows, 1), generator=gen)  # 0 listed, 1 listed + tail, 2 point
    tail = torch.where(kind == 1, 0.1, 0.0).expand(rows, max_k).contiguous()
    sparse_probs = torch.where((kind == 2).unsqueeze(-1), 0.0, sparse_probs)
    # a tail draft: the draft token unlisted (its entry zero) under a non-zero tail
    unlisted = (kind == 1) & (torch.rand(rows, max_k, generator=gen) < 0.3)
    sparse_probs[..., 0] = torch.where(unlisted, 0.0, sparse_probs[..., 0])
    is_greedy = torch.rand(rows, generator=gen) < 0.2
    uniform = torch.rand(rows, max_k, generator=gen)
    emit_uniform = torch.rand(rows, generator=gen, dtype=torch.float64)
    seeds = list(range(rows))
    position_keys = field_keys(
        [s for s in seeds for _ in range(max_k)], [10 + j for _ in seeds for j in range(max_k)]
    ).view(rows, max_k)
    bonus_keys = field_keys(seeds, [10 + int(n) for n in num_draft])
    args = (
        drafts, num_draft, sparse_ids, sparse_probs, probs, is_greedy, uniform, emit_uniform,
        tail, position_keys,
    )  # fmt: skip
    settled_out, settled_num = rejection_sample(*args, bonus_keys=bonus_keys)
    out, num = rejection_sample(*args)
    couple_bonus_tokens(out, num, num_draft, probs, is_greedy, bonus_keys)
    assert torch.equal(settled_num, num)
    assert torch.equal(settled_out, out)
    sampled = ~is_greedy
    stopped = num - 1 < num_draft
    assert int((sampled & ~stopped & (num_draft > 0)).sum()) > 5  # bonuses after drafts
    assert int((sampled & stopped).sum()) > 5  # corrections (residual or matched)
    assert int((is_greedy & stopped).sum()) > 0
