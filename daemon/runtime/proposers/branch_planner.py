"""Which branches a draft model pre-drafts for one sequence, within a budget of rows.

While the verifier checks d_0..d_{m-1}, the verdict (a, t) is likely one of: all accepted with
the draft's best guess for the bonus token (the main slot continues there), or a accepted
then one of the draft's best other tokens at position a. Each branch costs a row in every
draft step, so a sequence gets at most a budget of rows (the main one included; at most
`max_branches`, the branch cache's size; the verifier may ask for fewer per request), spent on
the likeliest verdicts by the draft's own estimates, calibrated online against the verdicts
seen (verdict_calibration.py); a fork whose estimate is below `min_branch_prob` is not worth
its row (sampled text: corrections are hard to guess) and is left out.

Correction forks start at once; the bonus alternatives are known only after the main row has
fed d_{m-1}, one step later (they also finish one step later, as the main row does): a bonus
guess likelier than the least likely live correction fork takes its place (that fork is
cancelled) so that the budget holds at every step.
"""

from dataclasses import dataclass, field

from daemon.runtime.proposers.draft_rows import DraftRow
from daemon.runtime.proposers.drafts import DraftRecord, PreparedBranch, correction_guesses
from daemon.runtime.proposers.verdict_calibration import (
    Cell,
    VerdictCalibration,
    bonus_cell,
    correction_cell,
)


@dataclass(slots=True)
class PlannedBranch:
    branch: PreparedBranch
    row: DraftRow  # the row drafting it (a fork row: its own branch slot)
    estimate: float  # the draft's estimate of this verdict's probability
    index: int  # the sequence's branch-slot index (0: the main slot)


@dataclass(slots=True)
class SequencePlan:
    slot: int
    record: DraftRecord  # the outstanding proposal d_0..d_{m-1}
    num_committed: int  # n: tokens committed before it
    k: int  # drafts per branch
    temperature: float
    draft_seed: int
    listing_mass: float = 0.0  # its sampled drafts' lists (DraftRow.listing_mass)
    main: DraftRow | None = None  # guesses the bonus, then drafts in the main slot
    main_branch: PlannedBranch | None = None
    forks: list[PlannedBranch] = field(default_factory=list)
    num_forks: int = 0  # fork rows allowed at any step (this request's budget - 1)
    bonus_guesses: list[tuple[int, float]] = field(default_factory=list)  # (token, q) best first

    def live_forks(self) -> list[PlannedBranch]:
        return [f for f in self.forks if not f.row.is_cancelled]

    def branches(self) -> list[PlannedBranch]:
        """The main branch first, then the forks that ran to the end."""
        main = [self.main_branch] if self.main_branch is not None else []
        return main + self.live_forks()


class BranchPlanner:
    def __init__(
        self,
        *,
        max_branches: int,
        branch_width: int,
        max_branch_k: int,
        max_model_len: int,
        min_branch_prob: float = 0.0,
    ) -> None:
        if max_branches < 1 or branch_width < 1 or max_branch_k < 1:
            raise ValueError(
                "need max_branches, branch_width, max_branch_k >= 1, got "
                f"{max_branches}, {branch_width}, {max_branch_k}"
            )
        self.max_branches = max_branches  # rows per sequence, the main one included
        self.branch_width = branch_width  # guesses considered per position
        self.max_branch_k = max_branch_k  # drafts per branch (the branch cache's length)
        self.max_model_len = max_model_len
        self.min_branch_prob = min_branch_prob
        self.calibration = VerdictCalibration()

    @property
    def forks_per_slot(self) -> int:
        return self.max_branches - 1

    def branch_slot(self, slot: int, index: int) -> int:
        return slot * self.forks_per_slot + index - 1

    def plan_corrections(self, plan: SequencePlan) -> None:
        """Start the likeliest correction forks the budget allows (after the main row)."""
        candidates = [
            (self.calibration.score(cell, estimate), cell[1], token)
            for cell, (token, estimate) in self._correction_cells(plan.record).items()
        ]
        candidates.sort(key=lambda c: -c[0])
        for score, a, token in candidates[: plan.num_forks]:
            if score >= self.min_branch_prob:
                self._start_fork(plan, a, token, plan.k, score)

    def on_guess(
        self, plan: SequencePlan, guesses: list[int], probs: list[float]
    ) -> list[DraftRow]:
        """The main row guessed the bonus token (it continues with guesses[0]); start forks
        for the other guesses where they beat the least likely live fork or fit the budget."""
        main = plan.main
        assert main is not None
        num_drafts = len(plan.record)
        plan.bonus_guesses = list(zip(guesses, probs, strict=True))
        cells = self._bonus_cells(plan.record, plan.bonus_guesses)
        scores = [self.calibration.score(cell, est) for cell, (_, est) in cells.items()]
        branch = PreparedBranch(num_drafts, guesses[0], main.record)
        plan.main_branch = PlannedBranch(branch, main, scores[0], 0)
        started = []
        for token, score in zip(guesses[1:], scores[1:], strict=True):
            live = plan.live_forks()
            if score < self.min_branch_prob:
                break
            if len(live) >= plan.num_forks:
                weakest = min(live, key=lambda f: f.estimate)
                if weakest.estimate >= score:
                    break
                weakest.row.is_cancelled = True
            row = self._start_fork(plan, num_drafts, token, main.num_to_draft, score)
            if row is not None:
                started.append(row)
        return started

    def observe(
        self, record: DraftRecord, bonus: list[tuple[int, float]], committed: list[int]
    ) -> None:
        """Learn from a verdict on `record`: `committed` holds what the verifier committed
        since (d_0..d_{a-1} then the correction or bonus token, when one round passed)."""
        num_accepted = len(committed) - 1
        if not 0 <= num_accepted <= len(record) or committed[:-1] != record.tokens[:num_accepted]:
            return
        cells = self._correction_cells(record)
        if bonus:
            cells.update(self._bonus_cells(record, bonus))
        token = committed[-1]
        kind = "all" if num_accepted == len(record) else "a"
        verdict = next(
            (
                cell
                for cell, (guess, _) in cells.items()
                if cell[0] == kind and guess == token and (kind == "all" or cell[1] == num_accepted)
            ),
            None,
        )
        self.calibration.observe({cell: est for cell, (_, est) in cells.items()}, verdict)

    def _correction_cells(self, record: DraftRecord) -> dict[Cell, tuple[int, float]]:
        """Cell -> (guessed token, the draft's estimate) for every correction guess."""
        cells = {}
        prefix = 1.0
        for a in range(len(record)):
            for rank, (token, q) in enumerate(correction_guesses(record, a, self.branch_width)):
                cells[correction_cell(a, rank)] = (token, prefix * q)
            prefix *= record.token_probs[a]
        return cells

    def _bonus_cells(
        self, record: DraftRecord, guesses: list[tuple[int, float]]
    ) -> dict[Cell, tuple[int, float]]:
        all_accepted = record.prefix_prob(len(record))
        return {
            bonus_cell(rank): (token, all_accepted * q) for rank, (token, q) in enumerate(guesses)
        }

    def _start_fork(
        self, plan: SequencePlan, a: int, token: int, k: int, estimate: float
    ) -> DraftRow | None:
        """Branch (a, token): fork the main slot at n + a, feed `token`, draft k after it."""
        fork = plan.num_committed + a
        k = min(k, self.max_branch_k, self.max_model_len - fork)
        used = {f.index for f in plan.live_forks()}
        free = [i for i in range(1, self.forks_per_slot + 1) if i not in used]
        if k <= 0 or not free:
            return None
        row = DraftRow(
            slot=self.branch_slot(plan.slot, free[0]),
            chunk=[token],
            next_pos=fork,
            num_to_draft=k,
            temperature=plan.temperature,
            draft_seed=plan.draft_seed,
            listing_mass=plan.listing_mass,
            parent=plan.slot,
            fork_position=fork,
        )
        plan.forks.append(
            PlannedBranch(PreparedBranch(a, token, row.record), row, estimate, free[0])
        )
        return row
