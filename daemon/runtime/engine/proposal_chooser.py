"""Listed proposals or coupled drafts for sampled rows: measured, the faster kept.

A sampled draft goes to the verifier in one of two exact forms (proposers/draft_sampling.py):
  * listed: the drafter's best tokens with their probabilities and a tail. Rejection sampling
    accepts a draft with probability 1 - TV(p, q), the most any proposal of q can get; but the
    drafter needs q's normaliser (a pass of exps over the vocabulary per draft step) and the
    verifier p itself (a softmax over every verified row);
  * coupled: the token alone, the drafter's Gumbel-max of q with a field the verifier shares,
    matched against the verifier's own Gumbel-max of p. No probabilities, no normaliser, a
    few bytes; accepted less often where q differs from p (at least (1 - TV) / (1 + TV)).
Which one emits more tokens a second depends on what the deployment cannot know in advance:
how far q is from p (the demo pair at temperature 1: acceptance 0.53 listed, 0.43 coupled),
and what the passes over the vocabulary cost against the forward passes (at Qwen's 151,936
tokens with a small model on one CPU core, the listed round's sampling took 31 ms against 5
coupled, with the same acceptance). So the engine measures both, per batch-size bucket (powers
of two): rounds alternate between the forms in blocks of BLOCK until each has MIN_ROUNDS, then
the form with the higher rate (tokens emitted per second of the whole round) is used, and the
other runs a block again now and then to stay current: as often as keeps the predicted loss
of those blocks (their rate deficit) within EXPLORE_BUDGET of the time, between
MIN_INTERVAL and MAX_INTERVAL rounds apart. A form replaces the incumbent only when it is
ahead by MARGIN. Only rounds in which some sampled row drafted, without a prefill, are
measured; greedy rows draft the argmax either way. A round in which a seeded sampled request
drafts keeps listed proposals (engine.py): a seed asks for the same tokens on every call, and
with listed proposals the tokens depend on the form, which this choice would make depend on
timing (coupled drafting, `proposal_tokens = 0`, gives the target-alone tokens in any case).
"""

import math
from dataclasses import dataclass, field

BLOCK = 4  # rounds of one form in a row while measuring
MIN_ROUNDS = 8  # rounds of each form in a bucket before choosing there
DECAY = 0.9  # weight kept by a form's older rounds at each of its new ones
MARGIN = 0.03  # a challenger must be this much faster to take over
EXPLORE_BUDGET = 0.01  # the other form's blocks may lose this share of the time, predicted
MIN_INTERVAL = 32  # rounds between two blocks of the other form, at least
MAX_INTERVAL = 512  # ... and at most


@dataclass(slots=True)
class FormRate:
    """Decayed sums of one form's rounds in one bucket."""

    tokens: float = 0.0
    seconds: float = 0.0
    rounds: int = 0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens = self.tokens * DECAY + tokens
        self.seconds = self.seconds * DECAY + seconds
        self.rounds += 1

    @property
    def rate(self) -> float:
        """Tokens per second (0 before any round)."""
        return self.tokens / self.seconds if self.seconds > 0.0 else 0.0


@dataclass(slots=True)
class Bucket:
    rates: dict[bool, FormRate] = field(
        default_factory=lambda: {False: FormRate(), True: FormRate()}
    )  # coupled? -> its rounds
    best: bool = False  # the form in use (False: listed)
    block_form: bool = False  # the form of the block being run
    block_left: int = 0  # rounds left in that block
    since_block: int = 0  # rounds of the incumbent since the other form's last block


class ProposalChooser:
    """`choose(batch)` before a round that drafts for sampled rows; `observe(...)` after it."""

    def __init__(self) -> None:
        self._buckets: dict[int, Bucket] = {}

    @staticmethod
    def bucket_of(batch: int) -> int:
        """Batch sizes 1, 2-3, 4-7, 8-15, ... share a bucket."""
        return max(1, batch).bit_length()

    def choose(self, batch: int) -> bool:
        """Whether this round's sampled drafts go coupled (else listed)."""
        b = self._buckets.setdefault(self.bucket_of(batch), Bucket())
        if b.block_left > 0:
            return b.block_form
        listed, coupled = b.rates[False], b.rates[True]
        if listed.rounds < MIN_ROUNDS or coupled.rounds < MIN_ROUNDS:
            # measuring: a block of the form with fewer rounds (listed first)
            b.block_form = coupled.rounds < listed.rounds
            b.block_left = BLOCK
            return b.block_form
        other = not b.best
        if b.since_block >= interval_between_blocks(b.rates[b.best].rate, b.rates[other].rate):
            b.since_block = 0
            b.block_form, b.block_left = other, BLOCK
            return other
        return b.best

    def observe(self, batch: int, coupled: bool, tokens: int, seconds: float) -> None:
        """A measured round of `batch` sequences in form `coupled`: `tokens` emitted over the
        whole round's `seconds`."""
        if seconds <= 0.0:
            return
        b = self._buckets.setdefault(self.bucket_of(batch), Bucket())
        b.rates[coupled].add(tokens, seconds)
        if b.block_left > 0 and b.block_form == coupled:
            b.block_left -= 1
        if coupled == b.best:
            b.since_block += 1
        incumbent, challenger = b.rates[b.best], b.rates[not b.best]
        if (
            min(incumbent.rounds, challenger.rounds) >= MIN_ROUNDS
            and challenger.rate > (1.0 + MARGIN) * incumbent.rate
        ):
            b.best = not b.best
            b.since_block = 0

    def form(self, batch: int) -> bool:
        """The form in use at this batch size (False: listed), measuring or not."""
        b = self._buckets.get(self.bucket_of(batch))
        return b.best if b is not None else False

    def rates(self, batch: int) -> tuple[float, float]:
        """(listed, coupled) measured tokens per second at this batch size (0: none yet)."""
        b = self._buckets.get(self.bucket_of(batch))
        if b is None:
            return 0.0, 0.0
        return b.rates[False].rate, b.rates[True].rate


def interval_between_blocks(best_rate: float, other_rate: float) -> int:
    """Incumbent rounds between two blocks of the other form: a block of BLOCK rounds at a
    deficit d = 1 - other / best loses about BLOCK * d rounds' worth of time, kept within
    EXPLORE_BUDGET of the rounds between."""
    if best_rate <= 0.0:
        return MIN_INTERVAL
    deficit = max(0.0, 1.0 - other_rate / best_rate)
    needed = math.ceil(BLOCK * deficit / EXPLORE_BUDGET - 1e-9)  # not a rounding error up
    return min(MAX_INTERVAL, max(MIN_INTERVAL, needed))
