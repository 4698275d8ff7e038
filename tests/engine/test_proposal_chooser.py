"""The proposal chooser (engine/proposal_chooser.py): listed proposals against coupled drafts,
measured per batch-size bucket, the faster kept, the other measured again now and then; and
the engine and the remote drafter doing what it chooses."""

from pathlib import Path

import pytest
import torch

from daemon.runtime.engine import proposal_chooser as pc
from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.proposal_chooser import ProposalChooser
from daemon.runtime.engine.request import Request
from daemon.runtime.model import load_model
from daemon.runtime.proposers.base import Proposals, ProposeRequest
from daemon.runtime.proposers.draft_model import DraftModelProposer
from daemon.runtime.proposers.draft_sampling import DraftSampler, RowKey
from daemon.runtime.proposers.drafts import PreparedBranch
from daemon.runtime.remote.messages import DraftEntry, DraftRequest
from daemon.runtime.remote.wire import decode_request, encode_request
from daemon.runtime.sampling.params import SamplingParams
from tests.remote.helpers import remote_engine

LISTED, COUPLED = False, True
PROMPTS = [[5, 9, 30], [7, 1, 2, 3, 4, 5, 6, 8], [100, 200], [17] * 12]


def _run(chooser: ProposalChooser, batch: int, rounds: int, rate: dict[bool, float]) -> list[bool]:
    """`rounds` rounds, each form emitting rate[form] tokens in one second; the forms used."""
    used = []
    for _ in range(rounds):
        form = chooser.choose(batch)
        chooser.observe(batch, form, round(rate[form]), 1.0)
        used.append(form)
    return used


def test_it_measures_both_forms_in_blocks_listed_first() -> None:
    chooser = ProposalChooser()
    used = _run(chooser, 16, 2 * pc.MIN_ROUNDS, {LISTED: 100, COUPLED: 100})
    block = pc.BLOCK
    expected = ([LISTED] * block + [COUPLED] * block) * (pc.MIN_ROUNDS // block)
    assert used == expected
    assert chooser.rates(16) == pytest.approx((100.0, 100.0))


@pytest.mark.parametrize(("listed", "coupled", "best"), [(100, 150, COUPLED), (150, 100, LISTED)])
def test_it_keeps_the_faster_form(listed: int, coupled: int, best: bool) -> None:
    chooser = ProposalChooser()
    _run(chooser, 16, 2 * pc.MIN_ROUNDS, {LISTED: listed, COUPLED: coupled})
    assert chooser.form(16) == best
    used = _run(chooser, 16, pc.MIN_INTERVAL - 1, {LISTED: listed, COUPLED: coupled})
    assert used == [best] * (pc.MIN_INTERVAL - 1)


def test_a_challenger_within_the_margin_does_not_take_over() -> None:
    chooser = ProposalChooser()
    _run(chooser, 16, 2 * pc.MIN_ROUNDS, {LISTED: 100, COUPLED: 102})
    assert chooser.form(16) == LISTED  # 2% is inside the 3% margin


def test_the_other_form_is_measured_again_as_often_as_its_deficit_allows() -> None:
    """A block of BLOCK rounds at a deficit d loses BLOCK * d rounds' time, kept within
    EXPLORE_BUDGET of the rounds between (1%: 40 rounds at 10%, 200 at 50%), at least
    MIN_INTERVAL and at most MAX_INTERVAL apart."""
    assert pc.EXPLORE_BUDGET == 0.01 and (pc.MIN_INTERVAL, pc.MAX_INTERVAL) == (32, 512)
    deficits = (0.0, 0.05, 0.1, 0.5, 0.9)
    intervals = [pc.interval_between_blocks(1000, 1000 * (1 - d)) for d in deficits]
    assert intervals == [32, 32, 40, 200, 360]
    assert pc.interval_between_blocks(1000, 0) == 400 and pc.interval_between_blocks(0, 5) == 32
    for deficit, interval in ((0.1, 40), (0.5, 200)):
        chooser = ProposalChooser()
        rate = {LISTED: 1000 * (1 - deficit), COUPLED: 1000}
        _run(chooser, 8, 2 * pc.MIN_ROUNDS, rate)
        used = _run(chooser, 8, 3 * (interval + pc.BLOCK), rate)
        other_at = [i for i, form in enumerate(used) if form == LISTED]
        starts = [i for i in other_at if i - 1 not in other_at]
        assert len(other_at) == 3 * pc.BLOCK
        assert starts == [interval + n * (interval + pc.BLOCK) for n in range(3)]


def test_a_form_that_got_faster_takes_over_at_its_next_block() -> None:
    chooser = ProposalChooser()
    _run(chooser, 4, 2 * pc.MIN_ROUNDS, {LISTED: 100, COUPLED: 150})
    assert chooser.form(4) == COUPLED
    # the listed form became much faster (say the draft came closer to the target): it is
    # seen at its next block, after as many rounds as a third slower allowed
    interval = pc.interval_between_blocks(150, 100)
    used = _run(chooser, 4, interval + 2 * pc.BLOCK, {LISTED: 300, COUPLED: 150})
    assert used[:interval] == [COUPLED] * interval
    assert chooser.form(4) == LISTED
    assert used[-pc.BLOCK :] == [LISTED] * pc.BLOCK


def test_batch_size_buckets_learn_apart() -> None:
    chooser = ProposalChooser()
    _run(chooser, 16, 2 * pc.MIN_ROUNDS, {LISTED: 100, COUPLED: 150})
    _run(chooser, 2, 2 * pc.MIN_ROUNDS, {LISTED: 150, COUPLED: 100})
    assert (chooser.form(16), chooser.form(31), chooser.form(2), chooser.form(3)) == (
        COUPLED,
        COUPLED,
        LISTED,
        LISTED,
    )
    assert chooser.form(1) == LISTED and chooser.rates(1) == (0.0, 0.0)  # not measured yet


def test_a_round_without_time_is_not_measured() -> None:
    chooser = ProposalChooser()
    form = chooser.choose(1)
    chooser.observe(1, form, 10, 0.0)
    assert chooser.rates(1) == (0.0, 0.0)


# -- the sampler, the engine, the remote drafter ----------------------------------------------
def test_a_coupled_round_of_a_listing_sampler_drafts_as_a_coupled_sampler() -> None:
    logits = torch.randn(6, 500, generator=torch.Generator().manual_seed(3)) * 2
    keys = [RowKey(temperature=t, draft_seed=11 + i, position=40 + i) for i, t in
            enumerate([0.7, 1.0, 0.0, 0.7, 1.3, 1.0])]  # fmt: skip
    listing, coupled = DraftSampler(32), DraftSampler(0)
    listed_steps = listing.sample(logits, keys)
    assert all(
        s.sparse is not None for s, k in zip(listed_steps, keys, strict=True) if k.temperature
    )
    listing.coupled_round = True
    steps, reference = listing.sample(logits, keys), coupled.sample(logits, keys)
    assert [s.token for s in steps] == [s.token for s in reference]
    assert all(s.sparse is None for s in steps)


def test_the_coupled_flag_crosses_the_wire() -> None:
    request = DraftRequest(message_id=9, propose=[DraftEntry(3, 4)], coupled=True)
    assert decode_request(encode_request(request)).coupled
    assert not decode_request(encode_request(DraftRequest(message_id=9))).coupled


def _requests(max_tokens: int, temperature: float = 0.8, seed: int | None = None) -> list[Request]:
    """Unseeded by default: the engine chooses the form of unseeded requests only."""
    return [
        Request(
            f"r{i}",
            p,
            SamplingParams(
                temperature=temperature,
                max_tokens=max_tokens,
                seed=None if seed is None else seed + i,
            ),
        )
        for i, p in enumerate(PROMPTS)
    ]


class _Forms:
    """Records, per call that drafts (fresh proposals, prepared branches), whether coupled
    drafts were asked for and whether any sampled draft came with a list."""

    def __init__(self, proposer: DraftModelProposer) -> None:
        self._propose, self._prepare = proposer.propose, proposer.prepare
        proposer.propose = self._proposing  # type: ignore[method-assign]
        proposer.prepare = self._preparing  # type: ignore[method-assign]
        self.rounds: list[tuple[bool, bool]] = []

    def _proposing(self, request: ProposeRequest) -> Proposals:
        proposals = self._propose(request)
        listed = proposals.sparse_probs is not None and bool((proposals.sparse_probs > 0).any())
        self.rounds.append((request.coupled, listed))
        return proposals

    def _preparing(
        self, request: ProposeRequest, max_branches: int | None = None
    ) -> list[list[PreparedBranch]]:
        branches = self._prepare(request, max_branches)
        sparse = [s for b in branches for br in b for s in br.drafts.sparse if s is not None]
        if sparse or any(br.drafts.tokens for b in branches for br in b):
            self.rounds.append((request.coupled, bool(sparse)))
        return branches


@pytest.mark.parametrize("choose", [True, False])
def test_the_engine_drafts_in_the_form_it_chose(
    target_dir: Path, close_draft_dir: Path, choose: bool
):
    batch = len(PROMPTS)
    proposer = DraftModelProposer(load_model(close_draft_dir, num_slots=batch), sparse_top_k=32)
    forms = _Forms(proposer)
    config = EngineConfig(max_batch_size=batch, num_speculative_tokens=3, choose_proposal=choose)
    engine = SpecEngine(load_model(target_dir, num_slots=batch), proposer, config)
    outputs = engine.generate(_requests(max_tokens=96))
    assert [len(o.token_ids) for o in outputs] == [96] * batch
    assert all(listed != coupled for coupled, listed in forms.rounds)  # each round its form
    asked = [coupled for coupled, _ in forms.rounds]
    if not choose:
        assert engine.chooser is None and not any(asked)
        return
    assert engine.chooser is not None
    listed_rate, coupled_rate = engine.chooser.rates(batch)
    assert listed_rate > 0 and coupled_rate > 0  # both measured, in blocks, listed first
    # (the first round, with the prefill, is not measured: the first block is one longer)
    assert asked[: 2 * pc.BLOCK + 1] == [False] * (pc.BLOCK + 1) + [True] * pc.BLOCK


def test_seeded_requests_keep_listed_proposals_and_their_tokens(
    target_dir: Path, close_draft_dir: Path
) -> None:
    """A seed asks for the same tokens on every call: rounds with a seeded sampled request
    are listed, never measured, and two runs give the same tokens whatever the timing."""
    batch = len(PROMPTS)
    outputs = []
    for _ in range(2):
        proposer = DraftModelProposer(load_model(close_draft_dir, num_slots=batch), sparse_top_k=32)
        forms = _Forms(proposer)
        config = EngineConfig(max_batch_size=batch, num_speculative_tokens=3)
        engine = SpecEngine(load_model(target_dir, num_slots=batch), proposer, config)
        outputs.append([o.token_ids for o in engine.generate(_requests(96, seed=7))])
        assert forms.rounds and not any(coupled for coupled, _ in forms.rounds)
        assert engine.chooser is not None and engine.chooser.rates(batch) == (0.0, 0.0)
    assert outputs[0] == outputs[1]


def test_greedy_rounds_are_not_measured(target_dir: Path, close_draft_dir: Path) -> None:
    batch = len(PROMPTS)
    proposer = DraftModelProposer(load_model(close_draft_dir, num_slots=batch), sparse_top_k=32)
    config = EngineConfig(max_batch_size=batch, num_speculative_tokens=3)
    engine = SpecEngine(load_model(target_dir, num_slots=batch), proposer, config)
    engine.generate(_requests(max_tokens=24, temperature=0.0))
    assert engine.chooser is not None and engine.chooser.rates(batch) == (0.0, 0.0)


def test_a_remote_drafter_drafts_in_the_form_asked(target_dir: Path, close_draft_dir: Path) -> None:
    for mode in ("sync", "overlapped"):
        with remote_engine(
            target_dir, close_draft_dir, mode=mode, k=3, batch=len(PROMPTS)
        ) as setup:
            drafter = setup.server.proposer
            assert isinstance(drafter, DraftModelProposer)
            forms = _Forms(drafter)
            outputs = setup.engine.generate(_requests(max_tokens=64))
            assert [len(o.token_ids) for o in outputs] == [64] * len(PROMPTS)
            asked = [coupled for coupled, _ in forms.rounds]
            assert any(asked) and not all(asked), mode
            assert all(listed != coupled for coupled, listed in forms.rounds), mode
