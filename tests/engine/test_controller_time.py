"""The adaptive controller's own time: what the cost model keeps between rounds equals what its
samples say, and a speculative choice is kept for a few rounds of the same batch."""

import random
from collections import defaultdict
from pathlib import Path

from daemon.runtime.engine.acceptance import AcceptanceEstimate
from daemon.runtime.engine.controller import (
    KEEP_CHOICE_ROUNDS,
    MIN_COST_SAMPLES,
    PRICE_LAG_RECORDS,
    PROBE_EVERY,
    ControllerConfig,
    SpeculationController,
)
from daemon.runtime.engine.cost_model import (
    DRAFT_MAX_AGE,
    MIN_CATCH_UP_BEHIND,
    CostModel,
    _fit_points,
    _median,
    _weighted_line,
)
from daemon.runtime.engine.request import Request
from daemon.runtime.sampling.params import SamplingParams
from tests.engine.helpers import make_engine


def _draft_line(costs: CostModel, batch: int) -> tuple[float, float]:
    """The draft line from every sample, nothing kept: through each k's median of its rounds
    younger than DRAFT_MAX_AGE drafting rounds, weighted by their count (the fit itself is
    the cost model's; what is checked is what it is fed)."""
    oldest = costs.draft_rounds[batch] - DRAFT_MAX_AGE
    points = []
    for k, samples in costs.draft_samples[batch].items():
        recent = [s for n, s in samples if n > oldest]
        if recent:
            points.append((float(k), _median(recent), float(len(recent))))
    return _fit_points(points)


def _overhead_line(costs: CostModel, batch: int) -> tuple[float, float]:
    """Through each k's median of the window, weighted by count; else flat at the median."""
    by_k: dict[int, list[float]] = defaultdict(list)
    for k, seconds in costs.overhead_samples[batch]:
        by_k[k].append(seconds)
    line = _weighted_line([(float(k), _median(v), float(len(v))) for k, v in by_k.items()])
    if line is None or line[1] <= 0.0:
        return _median([s for _, s in costs.overhead_samples[batch]]), 0.0
    return line


def _verify_table(costs: CostModel, batch: int) -> dict[int, float]:
    """Each length's median times the speed (the values are kept non-decreasing below)."""
    speed = _median(list(costs.speed_ratios)) if len(costs.speed_ratios) >= 3 else 1.0
    return {t: _median(list(v)) * speed for t, v in costs.verify_samples[batch].items()}


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-12 + 1e-9 * abs(b)


def test_what_the_cost_model_keeps_equals_what_its_samples_say() -> None:
    """Records of every kind at two batch sizes, in a random order long enough for drafting
    rounds to age out of the draft line and overhead samples to leave their window; after
    each, the lines and the verify table read (kept between reads) equal the ones made from
    the samples at that moment."""
    rng = random.Random(7)
    costs = CostModel()
    checked = 0
    for step in range(4000):
        batch = rng.choice([1, 4])
        k = rng.choice([1, 2, 2, 3, 3, 3, 5]) if step < 1500 else rng.choice([2, 3])
        kind = rng.random()
        if kind < 0.3:
            costs.record_draft(batch, k, (0.2 + 0.15 * k) * 1e-3 * rng.uniform(0.9, 1.3))
        elif kind < 0.6:
            t = rng.choice([1, 2, 3, 4, 6])
            costs.record_verify(batch, t, (1.0 + 0.1 * t) * 1e-3 * rng.uniform(0.9, 1.3))
        elif kind < 0.9:
            costs.record_overhead(batch, rng.choice([0, k]), 3e-4 * rng.uniform(0.8, 1.5))
        elif costs.draft_samples.get(batch):
            behind = rng.randint(MIN_CATCH_UP_BEHIND, 64)
            costs.record_catch_up(batch, k, behind, (1.0 + 0.05 * behind) * 1e-3)
        for b in (1, 4):
            if b in costs.draft_samples:
                got = costs._draft_line(b)
                want = _draft_line(costs, b)
                assert got is not None and all(map(_close, got, want)), (step, got, want)
            if b in costs.overhead_samples:
                got = costs._overhead_line(b)
                want = _overhead_line(costs, b)
                assert got is not None and all(map(_close, got, want)), (step, got, want)
            if b in costs.verify_samples:
                table, want = costs._verify_table(b), _verify_table(costs, b)
                assert table.keys() == want.keys()
                values = [table[t] for t in sorted(table)]
                assert values == sorted(values)  # made non-decreasing
                if want == dict(zip(sorted(want), sorted(want.values()), strict=True)):
                    assert all(_close(table[t], want[t]) for t in want), (step, table, want)
                    checked += 1
            if b in costs.catch_up_samples:
                samples = costs.catch_up_samples[b]
                fresh = CostModel(catch_up_samples={b: samples})
                assert costs.catch_up_line(b) == fresh.catch_up_line(b)
    assert checked > 1000  # most tables were already non-decreasing: compared value by value
    # k = 1 and 5 were drafted in the first 1,500 records only: their rounds aged out of the
    # line, which the lines kept between reads followed
    for b in (1, 4):
        oldest = costs.draft_rounds[b] - DRAFT_MAX_AGE
        assert {1, 5} <= costs.draft_samples[b].keys()
        assert all(n <= oldest for k in (1, 5) for n, _ in costs.draft_samples[b][k])


def _speculating(
    verify: dict[int, float] | None = None, scale: float = 1e-6
) -> tuple[SpeculationController, list[AcceptanceEstimate]]:
    """Batch 4, drafting cheap and every draft accepted: by default k = 8 wins. Prices in
    units of `scale` seconds: by default a round of ~30 us, which a choice in Python outlasts."""
    ctl = SpeculationController(ControllerConfig(max_k=8, adaptive=True))
    ctl.costs.record_draft(4, 1, 0.1 * scale)
    for length, units in (verify or {1: 30.0, 2: 30.0, 9: 32.0}).items():
        seconds = units * scale
        for _ in range(MIN_COST_SAMPLES):
            ctl.costs.record_verify(4, length, seconds)
    ests = [ctl.new_estimate() for _ in range(4)]
    for est in ests:
        for _ in range(50):
            ctl.observe(est, 8, 8)
    return ctl, ests


def test_a_speculative_choice_is_kept_for_a_few_rounds_of_the_same_batch() -> None:
    ctl, ests = _speculating()
    assert ctl.choose(ests, [8] * 4) == [8] * 4
    for _ in range(8):  # drafting got dear: plain decoding wins now
        ctl.costs.record_draft(4, 8, 0.5)
    chosen = [ctl.choose(ests, [8, 8, 3, 8]) for _ in range(KEEP_CHOICE_ROUNDS)]
    # kept (within each row's limit) for the rounds left of KEEP_CHOICE_ROUNDS, then made again
    assert chosen[: KEEP_CHOICE_ROUNDS - 1] == [[8, 8, 3, 8]] * (KEEP_CHOICE_ROUNDS - 1)
    assert max(chosen[-1]) < 8


def test_a_choice_is_made_every_round_where_it_takes_little_of_the_round() -> None:
    """Rounds of ~3 s: a choice takes far under KEEP_CHOICE_SHARE of one (as of a CPU's 30 ms
    round), and each round's is made afresh."""
    ctl, ests = _speculating(scale=0.1)
    assert ctl.choose(ests, [8] * 4) == [8] * 4
    for _ in range(8):
        ctl.costs.record_draft(4, 8, 5000.0)
    assert max(ctl.choose(ests, [8] * 4)) < 8


def test_a_new_batch_makes_the_choice_again_at_once() -> None:
    ctl, ests = _speculating()
    assert ctl.choose(ests, [8] * 4) == [8] * 4
    for _ in range(8):
        ctl.costs.record_draft(4, 8, 0.5)
    assert max(ctl.choose([*ests[:3], ctl.new_estimate()], [8] * 4)) < 8  # one sequence new


def test_kept_choices_leave_the_probes_on_schedule() -> None:
    """With nothing changing, the rounds between two probes are as many as without keeping:
    the probe (a length one deeper, or a cost probe) comes at round PROBE_EVERY."""
    ctl, ests = _speculating({1: 30.0, 2: 30.0, 5: 32.0, 9: 500.0})  # k = 4 wins; a pass of
    # 6 is not measured, so drafting 5 could win (a cost probe, then a probe one deeper)
    chosen = [ctl.choose(ests, [8] * 4) for _ in range(2 * PROBE_EVERY)]
    probes = [i for i, ks in enumerate(chosen) if ks != [4] * 4]
    assert probes == [PROBE_EVERY - 1, 2 * PROBE_EVERY - 1], chosen


def test_a_kept_choice_makes_its_probe() -> None:
    """The probe due in a kept round is decided from the kept choice's reading: from the round
    the choice was made in to the probe, none is made in full."""
    assert KEEP_CHOICE_ROUNDS >= PROBE_EVERY  # the probe falls within a kept choice
    ctl, ests = _speculating({1: 30.0, 2: 30.0, 5: 32.0, 9: 500.0})  # as above: k = 4
    assert ctl.choose(ests, [8] * 4) == [4] * 4
    made = ctl._last_choice
    chosen = [ctl.choose(ests, [8] * 4) for _ in range(PROBE_EVERY - 1)]
    assert chosen[:-1] == [[4] * 4] * (PROBE_EVERY - 2) and chosen[-1] != [4] * 4  # the probe
    assert ctl._last_choice is made


def test_round_prices_lag_a_few_samples_and_follow_a_new_length_at_once() -> None:
    """The controller reads the round prices again after PRICE_LAG_RECORDS cost samples, or
    at once when a sample adds a verify length, a drafting k or a batch size; meanwhile it
    reads the ones it kept."""
    ctl, _ = _speculating()
    first = ctl._round_costs(4, 8)
    assert first is not None and first == ctl.costs.round_costs(4, 8)
    for _ in range(PRICE_LAG_RECORDS - 1):  # plain passes twice as dear, lengths known
        ctl.costs.record_verify(4, 1, 60e-6)
    assert ctl._round_costs(4, 8) is first
    ctl.costs.record_verify(4, 1, 60e-6)
    second = ctl._round_costs(4, 8)
    assert second == ctl.costs.round_costs(4, 8) and second[0] > first[0]
    ctl.costs.record_verify(4, 5, 31e-6)  # a length measured first
    third = ctl._round_costs(4, 8)
    assert third is not second and third == ctl.costs.round_costs(4, 8)
    ctl.costs.record_draft(4, 3, 0.3e-6)  # a drafting k measured first
    fourth = ctl._round_costs(4, 8)
    assert fourth is not third and fourth == ctl.costs.round_costs(4, 8)
    assert ctl._round_costs(4, 8) is fourth
    ctl.costs.record_overhead(2, 0, 1e-6)  # a batch size first measured
    assert ctl._round_costs(4, 8) is not fourth


def test_a_plain_choice_made_for_a_drafter_behind_is_kept() -> None:
    """Drafting pays at its steady price, but the drafter is 64 tokens behind with 20 tokens
    a row left: the catch-up makes plain decoding the choice, and the next rounds of the
    batch keep it rather than making it again. The price at which it would flip counts the
    catch-up too (without it, plain rounds priced at 1 ms 'flipped' at once)."""
    ctl = SpeculationController(ControllerConfig(max_k=4, adaptive=True))
    for _ in range(MIN_COST_SAMPLES):
        for length, seconds in ((1, 1e-3), (2, 1.05e-3), (5, 1.3e-3)):
            ctl.costs.record_verify(4, length, seconds)
    ctl.costs.record_draft(4, 1, 1e-4)
    ctl.costs.record_draft(4, 2, 2e-4)
    for behind in (16, 32, 16, 32):  # feeding costs 0.1 ms a token behind
        ctl.costs.record_catch_up(4, 1, behind, 1e-4 + 1e-4 * behind)
    ests = [ctl.new_estimate() for _ in range(4)]
    for i in range(40):
        for est in ests:
            ctl.observe(est, 1, i % 2)
    assert max(ctl.choose(ests, [4] * 4)) >= 1  # nothing behind: speculation pays
    ctl._kept_batch = None
    for est in ests:  # new rounds of the batch's estimates, as after plain rounds
        ctl.observe(est, 1, 1)
    assert ctl.choose(ests, [4] * 4, behind=[64] * 4, left=[20] * 4) == [0] * 4
    kept = ctl._plain_batch
    plain = ctl._round_costs(4, 0)
    assert kept is not None and plain is not None and plain[0] <= ctl._plain_flip_cost
    for _ in range(3):
        assert ctl.choose(ests, [4] * 4, behind=[70] * 4, left=[18] * 4) == [0] * 4
        assert ctl._plain_batch is kept  # kept, not made again


def test_the_engine_reports_the_controllers_time(
    target_dir: Path, draft_dir: Path, prompts: list[list[int]]
) -> None:
    """Each round's stats carry the time its k was chosen in, within the time outside the
    passes; the totals add them up."""
    engine = make_engine(target_dir, draft_dir, k=4, adaptive=True, batch=2)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    for i, prompt in enumerate(prompts[:2]):
        engine.add_request(Request(f"r{i}", prompt, params))
    total = 0.0
    while engine.has_unfinished():
        stats = engine.step().stats
        assert stats.choose_time_s <= stats.overhead_time_s
        total += stats.choose_time_s
    assert total > 0.0 and engine.stats.choose_time_s == total
