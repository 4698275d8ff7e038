"""What to do with sequences whose verdict matched no prepared branch (overlapped mode).

FRESH: one call drafts them afresh and the round waits for it (D + R), as sync mode does.
SKIP: they go without drafts this round (one plain token each; the drafter prepares their
  next round from the committed tokens), so the verifier never waits on a round trip.
AUTO: per round, whichever yields more tokens per second by the measured costs:

    fresh: (hits + misses) * E / (V + W)      skip: (hits * E + misses) / V

with E the tokens a sequence gains in a round with drafts (accepted + 1, measured from the
verdicts), V the verifier's time between two proposals, W the wait of a fresh call. With one
sequence and a fast link FRESH wins (E > 1 + W / V); with a batch, one miss would make every
sequence wait, and SKIP wins. Until everything is measured, AUTO drafts afresh.
"""

from dataclasses import dataclass, field
from enum import StrEnum

EMA_WEIGHT = 0.1  # weight of the newest measurement


class MissPolicy(StrEnum):
    FRESH = "fresh"
    SKIP = "skip"
    AUTO = "auto"


@dataclass(slots=True)
class Ema:
    value: float | None = None

    def add(self, sample: float) -> None:
        self.value = (
            sample if self.value is None else self.value + EMA_WEIGHT * (sample - self.value)
        )


@dataclass(slots=True)
class MissCosts:
    tokens_per_round: Ema = field(default_factory=Ema)  # E
    gap_s: Ema = field(default_factory=Ema)  # V (and the engine's own bookkeeping)
    fresh_wait_s: Ema = field(default_factory=Ema)  # W

    def drafts_afresh(self, policy: MissPolicy, num_hits: int, num_misses: int) -> bool:
        if num_misses == 0 or policy is MissPolicy.SKIP:
            return False
        if policy is MissPolicy.FRESH:
            return True
        tokens, gap, wait = self.tokens_per_round.value, self.gap_s.value, self.fresh_wait_s.value
        if tokens is None or gap is None or wait is None or gap <= 0:
            return True
        fresh = (num_hits + num_misses) * tokens / (gap + wait)
        skip = (num_hits * tokens + num_misses) / gap
        return fresh > skip
