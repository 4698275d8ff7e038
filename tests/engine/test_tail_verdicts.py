"""The drafter learns from the verifier's verdicts how costly its proposals' tails are, and
widens its lists only when they are: a real engine on tiny checkpoints, sampled requests."""

from pathlib import Path

import torch

from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.request import Request
from daemon.runtime.model import load_model
from daemon.runtime.proposers.draft_model import DraftModelProposer
from daemon.runtime.proposers.drafts import DraftRecord, SparseDraw
from daemon.runtime.proposers.tail_verdicts import PRIOR_VERDICTS, TAIL_LOSS, TailVerdicts
from daemon.runtime.sampling.params import SamplingParams


def _record(tokens: list[int], from_tail: list[bool]) -> DraftRecord:
    """Drafts listing token 100 (and, for a listed draft, the token itself) with a tail."""
    record = DraftRecord()
    for token, tail in zip(tokens, from_tail, strict=True):
        ids = torch.tensor([100] if tail else [100, token])
        counts = torch.tensor([16_000] if tail else [8_000, 8_000])
        record.append(token, SparseDraw(ids, counts, 32_768 - int(counts.sum()), tail), [])
    return record


def test_verdicts_count_tail_drafts_up_to_the_first_replaced() -> None:
    verdicts = TailVerdicts()
    assert verdicts.acceptance() == 1.0 and verdicts.listing_mass(True) == 0.0  # costs nothing
    # tail draft 5 accepted, listed draft 6 accepted, tail draft 7 replaced by 9, tail draft 8
    # never tested
    verdicts.observe(_record([5, 6, 7, 8], [True, False, True, True]), [5, 6, 9, 4, 4])
    assert verdicts.latest == (2, 1)
    # fresh drafts after this verdict do not see it yet; drafts prepared before the next do
    assert verdicts.listing_mass(with_latest=False) == 0.0
    rate = (PRIOR_VERDICTS + 1) / (PRIOR_VERDICTS + 2)
    assert verdicts.acceptance(with_latest=True) == rate
    assert verdicts.listing_mass(with_latest=True) == 1 - TAIL_LOSS / (1 - rate)
    verdicts.observe(_record([3], [False]), [3, 1])  # a listed draft: no tail verdict
    assert verdicts.latest == (0, 0) and verdicts.acceptance(with_latest=False) == rate
    for _ in range(200):  # the tail is rejected half the time
        verdicts.observe(_record([1, 2], [True, True]), [1, 3])
    assert abs(verdicts.acceptance() - 0.5) < 0.05
    assert 0.98 < verdicts.listing_mass(True) < 0.995


def test_a_pessimistic_prior_widens_from_the_start() -> None:
    assert TailVerdicts(prior_acceptance=0.0).listing_mass(False) == 1 - TAIL_LOSS


def _engine(target: Path, draft: Path) -> tuple[SpecEngine, DraftModelProposer]:
    proposer = DraftModelProposer(load_model(draft, num_slots=8), sparse_top_k=2, max_listed=64)
    engine = SpecEngine(
        load_model(target, num_slots=8),
        proposer,
        EngineConfig(max_batch_size=8, num_speculative_tokens=3, draft_sparse_top_k=2),
    )
    return engine, proposer


def _sampled(prompts: list[list[int]]) -> list[Request]:
    params = SamplingParams(temperature=1.0, max_tokens=24, seed=7, ignore_eos=True)
    return [Request(f"r{i}", list(p), params) for i, p in enumerate(prompts)]


def test_a_disagreeing_draft_widens_its_lists(
    target_dir: Path, draft_dir: Path, prompts: list[list[int]]
) -> None:
    engine, proposer = _engine(target_dir, draft_dir)
    engine.generate(_sampled(prompts))
    verdicts = proposer.tail_verdicts
    assert verdicts.tested > PRIOR_VERDICTS + 10  # tail drafts were decided
    assert verdicts.acceptance() < 0.9  # random tiny models disagree beyond their best 2
    assert proposer.sampler.num_widened_rows > 0


def test_a_draft_equal_to_the_target_keeps_its_short_lists(
    target_dir: Path, prompts: list[list[int]]
) -> None:
    engine, proposer = _engine(target_dir, target_dir)
    engine.generate(_sampled(prompts))
    assert proposer.tail_verdicts.tested > PRIOR_VERDICTS + 10
    assert proposer.tail_verdicts.acceptance() > 0.99  # the two races always agree
    assert proposer.sampler.num_widened_rows == 0
