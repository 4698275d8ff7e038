"""The analytic speedup bound and the per-position acceptance it is fed."""

from bench.costs import SpeedupBound, expected_tokens_per_round
from bench.spec_engine import RunResult


def _run(num_drafts: int, accepted_per_pos: list[int]) -> RunResult:
    return RunResult(
        engine="specctl", mode="spec k=2", concurrency=1, num_requests=1, num_tokens=0,
        wall_s=1.0, tokens_per_s=0.0, acceptance_rate=None, mean_acceptance_length=None,
        num_rounds=num_drafts, num_drafts=num_drafts, accepted_per_pos=accepted_per_pos,
        draft_time_s=0.0, verify_time_s=0.0, prefill_time_s=0.0, overhead_per_round_ms=0.0,
        output_token_ids=[],
    )  # fmt: skip


def test_expected_tokens_per_round() -> None:
    assert expected_tokens_per_round(0.0, 4) == 1.0
    assert expected_tokens_per_round(1.0, 4) == 5.0
    assert abs(expected_tokens_per_round(0.5, 2) - 1.75) < 1e-12


def test_per_position_acceptance_fits_iid_rounds() -> None:
    # 4 rounds at k=2: accepted 2, 2, 1, 0 -> positions reached 2+2+2+1 = 7, accepted 5.
    run = _run(4, accepted_per_pos=[3, 2])
    assert abs((run.per_position_acceptance(2) or 0) - 5 / 7) < 1e-12
    assert _run(0, []).per_position_acceptance(2) is None


def test_speedup_bound() -> None:
    bound = SpeedupBound(
        acceptance=0.5, k=2, target_step_s=0.010, verify_s=0.010, draft_step_s=0.001
    )
    # 1.75 tokens per round of 2 ms drafting + 10 ms verifying, against 10 ms per token.
    assert abs(bound.speedup - 1.75 * 10 / 12) < 1e-12
    assert bound.cost_ratio == 10.0
