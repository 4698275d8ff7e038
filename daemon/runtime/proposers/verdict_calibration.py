"""How likely each verdict is, from the draft's own probabilities, calibrated online.

Branch planning ranks the verdicts (a, t) of the outstanding proposal d_0..d_{m-1}. The draft
offers an estimate that would be exact if it were the target:

    P(a accepted, correction = c_r) = q(d_0) ... q(d_{a-1}) * q_a(c_r)      (cell ("a", a, r))
    P(all accepted, bonus = g_r)    = q(d_0) ... q(d_{m-1}) * q_m(g_r)     (cell ("all", 0, r))

where c_r / g_r is the draft's r-th best guess there. It is not the target (typically it is
over-confident, and which cells are common depends on the pair and the text), so each cell's
estimate is scaled by that cell's record so far: (verdicts that fell in the cell + 1) /
(estimated mass the cell was given + 1). This keeps the per-sequence information of q (a
confident draft makes early rejections unlikely) while learning the systematic bias of every
cell from the verdicts the drafter sees.
"""

from dataclasses import dataclass, field

Cell = tuple[str, int, int]  # ("a", accepted count, guess rank) or ("all", 0, guess rank)


def correction_cell(num_accepted: int, rank: int) -> Cell:
    return ("a", num_accepted, rank)


def bonus_cell(rank: int) -> Cell:
    return ("all", 0, rank)


@dataclass(slots=True)
class _CellRecord:
    hits: float = 0.0
    predicted: float = 0.0

    @property
    def ratio(self) -> float:
        return (self.hits + 1.0) / (self.predicted + 1.0)


@dataclass(slots=True)
class VerdictCalibration:
    _cells: dict[Cell, _CellRecord] = field(default_factory=dict)
    num_verdicts: int = 0

    def score(self, cell: Cell, estimate: float) -> float:
        """The calibrated probability of `cell` for a sequence whose draft estimates it at
        `estimate` (the formulas in the module doc)."""
        record = self._cells.get(cell)
        return estimate if record is None else estimate * record.ratio

    def observe(self, estimates: dict[Cell, float], verdict: Cell | None) -> None:
        """One verdict: every cell's estimate for it, and the cell it fell in (None: no cell
        had the verdict's token among its guesses)."""
        self.num_verdicts += 1
        for cell, estimate in estimates.items():
            self._cells.setdefault(cell, _CellRecord()).predicted += estimate
        if verdict is not None:
            self._cells.setdefault(verdict, _CellRecord()).hits += 1.0
