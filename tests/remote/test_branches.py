"""Pre-drafted branches hold exactly what fresh drafting of their prefix gives, and adopting
one leaves the proposer in the state fresh drafting would have."""

from pathlib import Path

import pytest
import torch

from daemon.runtime.model import load_model
from daemon.runtime.proposers.base import ProposeRequest
from daemon.runtime.proposers.draft_model import DraftModelProposer
from daemon.runtime.proposers.drafts import NO_BRANCH, DraftRecord
from daemon.runtime.proposers.ngram import NgramProposer
from daemon.runtime.sampling.params import SamplingParams

K = 4
SEED = 1234


def _request(slot: int, tokens: list[int], k: int, temperature: float) -> ProposeRequest:
    params = SamplingParams(temperature=temperature)
    return ProposeRequest([slot], [tokens], [k], [params], [SEED])


def _fresh(draft_dir: Path, tokens: list[int], temperature: float) -> DraftRecord:
    """What a brand-new proposer drafts after `tokens`."""
    proposer = DraftModelProposer(load_model(draft_dir, num_slots=1))
    proposer.admit([0], [tokens])
    proposer.propose(_request(0, tokens, K, temperature))
    return proposer._outstanding[0]


def _same(branch: DraftRecord, fresh: DraftRecord) -> None:
    """Same tokens, same supports; counts equal up to one count (2^-15) where the branch's
    batched pass and the fresh single-row pass round a probability differently (their logits
    agree to float precision, not bit for bit: batch-invariant kernels would be needed)."""
    assert branch.tokens == fresh.tokens
    for mine, theirs in zip(branch.sparse, fresh.sparse, strict=True):
        assert (mine is None) == (theirs is None)
        if mine is not None and theirs is not None:
            assert torch.equal(mine.ids, theirs.ids)
            assert int((mine.counts - theirs.counts).abs().max()) <= 1


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
def test_every_branch_equals_fresh_drafting(
    draft_dir: Path, prompts: list[list[int]], temperature: float
) -> None:
    proposer = DraftModelProposer(
        load_model(draft_dir, num_slots=4), max_branches=6, min_branch_prob=0.0, is_branching=True
    )
    context = prompts[2]
    proposer.admit([3], [context])
    drafts = proposer.propose(_request(3, context, K, temperature)).draft_token_ids[0].tolist()
    branches = proposer.prepare(_request(3, context, K, temperature))[0]
    assert len(branches) == 6
    assert branches[0].num_accepted == K  # the main slot continues the all-accepted verdict
    assert {b.num_accepted for b in branches[1:]} - {K}  # and forks cover corrections
    assert len({b.key for b in branches}) == len(branches)
    for branch in branches:
        assert branch.token != ([*drafts, -1])[branch.num_accepted]  # a real alternative
        prefix = context + drafts[: branch.num_accepted] + [branch.token]
        assert len(branch.drafts) == K
        _same(branch.drafts, _fresh(draft_dir, prefix, temperature))


@pytest.mark.parametrize("which", [0, -1], ids=["main-branch", "fork-branch"])
def test_adopting_a_branch_then_drafting_equals_fresh(
    draft_dir: Path, prompts: list[list[int]], which: int
) -> None:
    """Round after round: adopt a branch (the main slot, or a promoted fork), let the verifier
    commit part of its drafts and a new token, and draft afresh: same as a new proposer."""
    proposer = DraftModelProposer(
        load_model(draft_dir, num_slots=2), max_branches=4, min_branch_prob=0.0, is_branching=True
    )
    tokens = list(prompts[4])
    proposer.admit([1], [tokens])
    drafts = proposer.propose(_request(1, tokens, K, 0.0)).draft_token_ids[0].tolist()
    for _ in range(3):
        branches = proposer.prepare(_request(1, tokens, K, 0.0))[0]
        index = which % len(branches)
        chosen = branches[index]
        assert len(branches) == 4 and (index == 0) == (which == 0)  # 0: the main slot's
        committed = [*drafts[: chosen.num_accepted], chosen.token]
        proposer.adopt(1, index, K, committed)
        tokens += committed
        drafts = chosen.drafts.tokens
    # the verifier accepts two drafts then corrects: drafting afresh from there
    tokens += [*drafts[:2], 7]
    proposer.adopt(1, NO_BRANCH, 0, [*drafts[:2], 7])
    again = proposer.propose(_request(1, tokens, K, 0.0))
    assert again.draft_token_ids[0].tolist() == _fresh(draft_dir, tokens, 0.0).tokens


def test_fallback_runner_prepares_the_main_branch_only(draft_dir: Path, prompts) -> None:
    proposer = DraftModelProposer(load_model(draft_dir, num_slots=1, backend="hf"))
    proposer.admit([0], [prompts[1]])
    drafts = proposer.propose(_request(0, prompts[1], K, 0.0)).draft_token_ids[0].tolist()
    branches = proposer.prepare(_request(0, prompts[1], K, 0.0))[0]
    assert [b.num_accepted for b in branches] == [K]
    prefix = prompts[1] + drafts + [branches[0].token]
    assert branches[0].drafts.tokens == _fresh(draft_dir, prefix, 0.0).tokens


def test_ngram_branches_are_lookups_of_their_prefix() -> None:
    ngram = NgramProposer(branch_width=2)
    tokens = [5, 6, 7, 8, 5, 6, 9, 1, 5, 6, 7, 2, 5]
    ngram.propose(_request(0, tokens, 3, 0.0))
    drafts = ngram._outstanding[0]
    assert drafts == [6, 7, 2]
    branches = ngram.prepare(_request(0, tokens, 3, 0.0))[0]
    assert branches and branches[0].num_accepted == len(drafts)
    for branch in branches:
        prefix = tokens + drafts[: branch.num_accepted] + [branch.token]
        assert branch.drafts.tokens == ngram.lookup(prefix, 3)
        if branch.num_accepted < len(drafts):
            assert branch.token != drafts[branch.num_accepted]
    # "5 6" was followed by 7 and by 9: after accepting "6", the correction guesses are 9 then 7
    # minus the rejected 7
    keys = {b.key for b in branches}
    assert (1, 9) in keys
    ngram.adopt(0, 0, 2, [*drafts, branches[0].token])
    assert ngram._outstanding[0] == branches[0].drafts.tokens[:2]
