"""How many branches per sequence to ask the drafter to prepare.

More branches raise the hit rate but lengthen the drafter's prepare (a row per branch in every
draft step). Preparing is free while it fits in the time the verifier spends verifying; past
that the verifier waits for it. So the budget follows the measured fit: it drops by one when
the verifier had to wait for the branches (more than WAIT_FRACTION of the time it gave them),
and grows by one when the last prepare, one branch's worth longer, would still have fit in
ROOM_FRACTION of that time. Fixed when not adaptive.
"""

from dataclasses import dataclass

WAIT_FRACTION = 0.05
ROOM_FRACTION = 0.8


@dataclass(slots=True)
class BranchBudget:
    maximum: int  # never ask for more (the drafter also caps at its own)
    value: int  # branches per sequence asked for now
    is_adaptive: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.value <= self.maximum <= 255:
            raise ValueError(f"need 1 <= branches {self.value} <= max {self.maximum} <= 255")

    def update(self, gap_s: float, waited_s: float, prepare_s: float) -> None:
        """After collecting a prepare: `gap_s` from sending it to needing it, `waited_s` spent
        waiting for it then, `prepare_s` the drafter's own time preparing it."""
        if not self.is_adaptive or gap_s <= 0:
            return
        if waited_s > WAIT_FRACTION * gap_s:
            self.value = max(1, self.value - 1)
        elif prepare_s * (self.value + 1) / self.value < ROOM_FRACTION * gap_s:
            self.value = min(self.maximum, self.value + 1)
