"""Matching point-mass drafts against the verifier's own choices (sampling/matching.py)."""

import pytest
import torch

from daemon.runtime.model import native
from daemon.runtime.sampling.gumbel_field import (
    NOT_SEARCHED,
    field_key_run,
    field_keys,
    gumbel_argmax,
)
from daemon.runtime.sampling.matching import accept_matching, target_choices
from daemon.runtime.sampling.params import SamplingParams

VOCAB = 700


def _sampled(top_k: int = 0, top_p: float = 1.0) -> SamplingParams:
    return SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p)


GREEDY = SamplingParams(temperature=0.0)


def test_each_row_chooses_by_its_own_rule_whatever_the_batch() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 2, VOCAB, generator=gen) * 3  # [B, T, V]
    fields = [(5, 10), (6, 20), (7, 30)]
    mixed = target_choices(logits.clone(), [_sampled(), _sampled(5), GREEDY], [2, 2, 2], fields)
    alone = target_choices(logits[:1].clone(), [_sampled()], [2], fields[:1])
    assert mixed[0] == alone[0]  # a plain row: the same next to a truncated one
    keys = field_keys([5, 5], [10, 11])
    expected = gumbel_argmax(logits[0].clone(), keys, noise_scale=torch.full((2,), 0.8))
    assert mixed[0] == expected.tolist()
    top5 = logits[1].topk(5, dim=-1).indices  # [T, 5]
    assert all(mixed[1][t] in top5[t].tolist() for t in range(2))  # truncated: top-5 only
    assert mixed[2] == logits[2].argmax(-1).tolist()  # greedy: the argmax


def test_rows_choose_at_the_positions_they_need_only() -> None:
    logits = torch.randn(2, 3, VOCAB, generator=torch.Generator().manual_seed(4))
    choices = target_choices(logits, [GREEDY, _sampled()], [1, 3], [(1, 0), (1, 3)])
    assert len(choices[0]) == 1 and len(choices[1]) == 3 and min(choices[1]) >= 0
    with pytest.raises(ValueError, match="row 0 needs 4 positions of the 3 scored"):
        target_choices(logits, [GREEDY, GREEDY], [4, 1], None)
    with pytest.raises(ValueError, match="fields are needed where a row samples"):
        target_choices(logits, [GREEDY, _sampled()], [1, 1], None)


def test_keys_of_a_run_of_positions_are_the_field_keys() -> None:
    seed = (1 << 63) - 5
    assert field_key_run(seed, 7, 4) == field_keys([seed] * 4, [7, 8, 9, 10]).tolist()
    with pytest.raises(ValueError, match="position must be >= 0"):
        field_key_run(seed, -1, 2)


def test_accept_while_drafts_equal_the_choices() -> None:
    drafts = [[4, 5, 6], [4, 9, 6], [7], []]
    choices = [[4, 5, 6, 8], [4, 5, 6, 8], [7, 3], [2]]
    assert accept_matching(drafts, choices) == [[4, 5, 6, 8], [4, 5], [7, 3], [2]]
    with pytest.raises(ValueError, match="2 choices for 2 drafts: one more is needed"):
        accept_matching([[1, 2]], [[1, 2]])


def test_hinted_choices_are_the_choices() -> None:
    """The verifier hints its drafts to the search for its choices: right, wrong or missing
    hints, the choices are the same up to a row's first draft that is not its choice, and
    so is what is accepted. After it a sampled row's choices are not searched where the C
    search runs (NOT_SEARCHED): nothing reads them."""
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(4, 4, VOCAB, generator=gen) * 2  # [B, T, V]
    params = [_sampled(), _sampled(), GREEDY, _sampled(top_k=7)]
    fields = [(1, 0), (2, 5), (3, 9), (4, 2)]
    plain = target_choices(logits.clone(), params, [4] * 4, fields)
    right = [row[:3] for row in plain]
    wrong = [[(c + 1) % VOCAB for c in row[:3]] for row in plain]
    second_wrong = [[row[0], (row[1] + 1) % VOCAB, row[2]] for row in plain]
    for hints in (right, wrong, second_wrong, [[], [], [], []]):
        hinted = target_choices(logits.clone(), params, [4] * 4, fields, hints=hints)
        for drafts, got, expected in zip(hints, hinted, plain, strict=True):
            n = next((t for t, d in enumerate(drafts) if d != expected[t]), len(drafts))
            assert got[: n + 1] == expected[: n + 1]
            assert all(g in (e, NOT_SEARCHED) for g, e in zip(got, expected, strict=True))
        assert accept_matching(hints, hinted) == accept_matching(hints, plain)
        if hints is second_wrong and native.kernels() is not None:
            # the sampled rows (0, 1: plain; 3: top-k) stop at their second draft
            assert [hinted[b][2:] for b in (0, 1, 3)] == [[NOT_SEARCHED] * 2] * 3
            assert hinted[2] == plain[2]  # greedy: every choice is one argmax pass
