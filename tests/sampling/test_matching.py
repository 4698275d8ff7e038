"""Matching point-mass drafts against the verifier's own choices (sampling/matching.py)."""

import torch

from daemon.runtime.sampling.gumbel_field import field_keys, gumbel_argmax
from daemon.runtime.sampling.matching import accept_matching, target_choices

VOCAB = 700


def _choices(logits: torch.Tensor, greedy: list[bool], top_k: list[int], keys: torch.Tensor):
    num_seqs, width, _ = logits.shape
    return target_choices(
        logits.clone(),
        torch.tensor(greedy),
        torch.full((num_seqs,), 0.8),
        torch.tensor(top_k),
        torch.ones(num_seqs),
        keys,
        torch.full((num_seqs,), width),
    )


def test_each_row_chooses_by_its_own_rule_whatever_the_batch() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 2, VOCAB, generator=gen) * 3  # [B, T, V]
    keys = field_keys([5, 6, 7, 5, 6, 7], [10, 11, 20, 21, 30, 31]).view(3, 2)
    mixed = _choices(logits, [False, False, True], [0, 5, 0], keys)
    alone = _choices(logits[:1], [False], [0], keys[:1])
    assert torch.equal(mixed[0], alone[0])  # a plain row: the same next to a truncated one
    expected = gumbel_argmax(logits[0].clone(), keys[0], noise_scale=torch.full((2,), 0.8))
    assert torch.equal(mixed[0], expected)
    top5 = logits[1].topk(5, dim=-1).indices  # [T, 5]
    assert all(int(mixed[1, t]) in top5[t].tolist() for t in range(2))  # truncated: top-5 only
    assert torch.equal(mixed[2], logits[2].argmax(-1))  # greedy: the argmax


def test_rows_past_their_drafts_are_not_chosen() -> None:
    logits = torch.randn(2, 3, VOCAB, generator=torch.Generator().manual_seed(4))
    choices = target_choices(
        logits, torch.tensor([True, False]), torch.ones(2), torch.zeros(2, dtype=torch.long),
        torch.ones(2), field_keys([1] * 6, list(range(6))).view(2, 3), torch.tensor([1, 3]),
    )  # fmt: skip
    assert choices[0, 1:].tolist() == [-1, -1] and bool((choices[1] >= 0).all())


def test_accept_while_drafts_equal_the_choices() -> None:
    drafts = torch.tensor([[4, 5, 6], [4, 9, 6], [7, -1, -1], [1, 2, 3]])
    num_draft = torch.tensor([3, 3, 1, 0])
    choices = torch.tensor([[4, 5, 6, 8], [4, 5, 6, 8], [7, 3, -1, -1], [2, -1, -1, -1]])
    out, num = accept_matching(drafts, num_draft, choices)
    assert num.tolist() == [4, 2, 2, 1]
    assert out.tolist() == [[4, 5, 6, 8], [4, 5, -1, -1], [7, 3, -1, -1], [2, -1, -1, -1]]


def test_hinted_choices_are_the_choices() -> None:
    """The verifier hints its drafts to the search for its choices: right, wrong or missing
    hints, the choices are the same."""
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(4, 3, VOCAB, generator=gen) * 2  # [B, T, V]
    keys = field_keys([1, 2, 3, 4] * 3, list(range(12))).view(4, 3)
    args = (torch.tensor([False, False, True, False]), torch.full((4,), 0.8))
    rest = (torch.tensor([0, 0, 0, 7]), torch.ones(4), keys, torch.full((4,), 3))
    plain = target_choices(logits.clone(), *args, *rest)
    wrong = (plain[:, :2] + 1) % VOCAB
    for hints in (plain[:, :2], wrong, torch.full((4, 2), -1)):
        assert torch.equal(target_choices(logits.clone(), *args, *rest, hints=hints), plain)
