"""Model-free parts of the remote path: verdicts read back from committed tokens, the branch
budget, the verdict calibration, options and statistics."""

import pytest

from daemon.runtime.proposers.drafts import DraftRecord, PreparedBranch
from daemon.runtime.proposers.verdict_calibration import (
    VerdictCalibration,
    bonus_cell,
    correction_cell,
)
from daemon.runtime.remote.branch_budget import BranchBudget
from daemon.runtime.remote.options import RemoteMode, RemoteOptions
from daemon.runtime.remote.remote_stats import RemoteRoundStats, RemoteStats
from daemon.runtime.remote.verdict import find_branch, read_verdict


def test_read_verdict() -> None:
    drafts = [7, 8, 9]
    before = [1, 2, 3]
    assert read_verdict(drafts, 3, [*before, 7, 8, 5]).kind == "a=2"  # type: ignore[union-attr]
    verdict = read_verdict(drafts, 3, [*before, 7, 8, 9, 4])
    assert verdict is not None and (verdict.kind, verdict.token) == ("all", 4)
    assert read_verdict(drafts, 3, [*before, 6]).num_accepted == 0  # type: ignore[union-attr]
    assert read_verdict(drafts, 3, before) is None  # nothing committed
    assert read_verdict(drafts, 3, [*before, 7, 8, 9, 4, 5]) is None  # a round in between
    assert read_verdict(drafts, 3, [*before, 6, 8, 5]) is None  # not a verdict on these drafts
    assert read_verdict([], 3, [*before, 6]).kind == "all"  # type: ignore[union-attr]


def test_find_branch_reports_the_guess_rank() -> None:
    empty = DraftRecord()
    branches = [
        PreparedBranch(3, 11, empty),  # main: all accepted, best guess
        PreparedBranch(0, 20, empty),
        PreparedBranch(0, 21, empty),
        PreparedBranch(3, 12, empty),
    ]
    verdict = read_verdict([1, 2, 3], 0, [1, 2, 3, 12])
    assert verdict is not None and find_branch(branches, verdict) == (3, 1)
    verdict = read_verdict([1, 2, 3], 0, [21])
    assert verdict is not None and find_branch(branches, verdict) == (2, 1)
    verdict = read_verdict([1, 2, 3], 0, [1, 22])
    assert verdict is not None and find_branch(branches, verdict) is None


def test_branch_budget_follows_the_time_available() -> None:
    budget = BranchBudget(maximum=4, value=2)
    budget.update(gap_s=0.010, waited_s=0.002, prepare_s=0.011)  # waited: fewer
    assert budget.value == 1
    budget.update(gap_s=0.010, waited_s=0.002, prepare_s=0.011)
    assert budget.value == 1  # never below one
    budget.update(gap_s=0.010, waited_s=0.0, prepare_s=0.003)  # one more would fit: more
    assert budget.value == 2
    budget.update(gap_s=0.010, waited_s=0.0, prepare_s=0.007)  # one more would not fit
    assert budget.value == 2
    for _ in range(5):
        budget.update(gap_s=1.0, waited_s=0.0, prepare_s=0.001)
    assert budget.value == 4  # capped
    fixed = BranchBudget(maximum=4, value=3, is_adaptive=False)
    fixed.update(gap_s=0.010, waited_s=0.5, prepare_s=0.5)
    assert fixed.value == 3
    with pytest.raises(ValueError):
        BranchBudget(maximum=2, value=3)


def test_calibration_learns_each_cell_bias() -> None:
    cal = VerdictCalibration()
    correction, bonus = correction_cell(0, 1), bonus_cell(0)
    assert cal.score(correction, 0.2) == 0.2  # nothing seen: the draft's own estimate
    for _ in range(50):  # the draft says 0.2, but this cell never happens
        cal.observe({correction: 0.2, bonus: 0.5}, bonus)
    assert cal.score(correction, 0.2) < 0.02
    assert cal.score(bonus, 0.5) > 0.9  # and the bonus cell always did


def test_options_are_checked() -> None:
    assert RemoteOptions(mode="sync").mode is RemoteMode.SYNC
    assert RemoteOptions().is_overlapped
    with pytest.raises(ValueError):
        RemoteOptions(mode="async")
    with pytest.raises(ValueError):
        RemoteOptions(call_timeout_s=0)
    with pytest.raises(ValueError):
        RemoteOptions(initial_branches=7, max_branches=6)


def test_stats_totals() -> None:
    stats = RemoteStats()
    first = RemoteRoundStats(num_seqs=2, num_with_branches=2, num_hits=1, bytes_sent=100)
    first.outcomes.update({"all": 1, "a=0": 1})
    first.hits.update({"all": 1})
    first.branch_budget = 3
    stats.add(first)
    stats.add(RemoteRoundStats(num_seqs=2, bytes_received=300, is_without_drafter=True))
    assert stats.hit_rate == 0.5 and stats.bytes_per_seq_round == 100.0
    assert stats.hit_rate_by_kind() == {"a=0": 0.0, "all": 1.0}
    assert stats.num_rounds_without_drafter == 1 and stats.mean_branch_budget == 3.0
