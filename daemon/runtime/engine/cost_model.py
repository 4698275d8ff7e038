"""Measured cost of a speculation round, by batch size: draft, verify, and fixed overhead.

    round(B, k) = draft(B, k) + verify(B, k + 1) + overhead(B)

- draft(B, k) = a_B + b_B * k: a least-squares line through each k's median of its recent
  rounds, weighted by their count. The intercept holds what every drafting round pays once
  (feeding the tokens committed since the last round, the first step's set-up); a flat
  per-step average would charge it k times too few or too many. Each k keeps its own recent
  rounds (at most DRAFT_MAX_AGE drafting rounds old): a line through the latest 32 rounds
  alone, where the controller had settled on k = 4 and 5, took its slope from two
  neighbouring k and a few slow rounds (0.69 ms + 0.07 ms a step, where the rounds cost
  0.14 + 0.14 per step: the demo pair at batch 1 on a CPU), priced k = 2 at twice what it
  cost, and drafted 4-5 where 2 paid (on an H200, 0.43 + 0.28 where 0.13 + 0.29: plain
  decoding where k = 2 paid).
- verify(B, T): the median of recent passes of T tokens per sequence (robust to the odd slow
  pass: a first pass of a shape, a collection, a neighbour on the core), interpolated
  linearly in T between measured lengths, times the machine's current speed (below).
  A round that first fed the drafter the tokens of rounds without drafts (a catch-up) is
  left out of that line (engine.py says why); what it cost beyond the line's price is
  learned apart, as e_B + f_B * (tokens behind per row): what an exploratory round from
  plain decoding pays for the plain rounds before it (controller.py). Until a catch-up is
  learned, the engine's first drafting round stands in for it (record_first_catch_up).
- overhead(B, k) = c_B + d_B * k: the time per round outside the forward passes (scheduling,
  sampling, bookkeeping), a line through the median of each k's recent rounds. Its fixed
  part favours longer rounds; leaving it out makes short rounds look cheaper than they are.
  Its part per draft (rows to verify, tokens to commit and check for stops) was lost while
  it was taken for a constant: with the demo pair at batch 16 on the CPU a round spent
  0.7 ms outside its passes at k = 0 and 1.4 ms at k = 3..5, and the median (1.0 ms)
  charged plain rounds 0.3 ms too much and long ones 0.4 ms too little.
Each batch size keeps its own samples; one not measured yet takes the nearest measured one's.
They were grouped by powers of two, but a group's cost is not one cost: at concurrency 16
the rounds of a wave's tail (9 to 15 sequences, drafting long) were filed with the full
batch's, and T = 6 and 7 were priced below T = 5 at 16 sequences (12.0 and 14.6 ms against
15.0; a pass of 6 at 16 sequences took 24.7 ms).

The machine's speed drifts (a shared core, clocks, a neighbour's memory traffic): on the
2-core bench machine a batch-16 pass of the wide target cost 45 ms in one minute and 60 ms a
few minutes later. A length the controller stopped choosing keeps the samples of the
spell it was measured in, while the length it runs follows the drift, so the two were
compared across spells: T = 2 measured fast (87 ms) against T = 1 measured slow (61 ms)
priced a round drafting one token at 1.4x a plain round where it cost 2x, and the controller drafted
at a loss until T = 2's samples turned over. So every verify sample is stored divided by the
speed it ran at, and predictions multiply by the current speed. The speed is the median of
the last NUM_SPEED_RATIOS ratios of a pass's seconds to its own (batch size, length)
median, counted once that length has MIN_SPEED_REFERENCE samples: a steady machine keeps it
at exactly 1, a lone slow pass does not move it, and a lasting change moves it within
about half the window. It scales every verify length alike, so the choice between lengths
follows the cost curve's shape, measured whenever each length was.

But a drift does not scale every length alike. On the 2-core machine, at 16 sequences on the
wide bench target, a pass of 1 token went from 76 to 52 ms within a minute while a pass of 3
went from 120 to 102 (T = 3 over T = 1: 1.58, then 1.96): a neighbour reading memory slows a
weight-read-bound pass more than a compute-bound one. A length measured in another spell then
keeps a wrong ratio to the one the controller runs, whatever the speed says: adaptive priced
T = 2 at 1.89x T = 1 (1.46x once re-measured), drafted 4 where k = 2 paid, and made 0.25 tokens
a ms against k = 2's 0.30. So each (batch size, T) notes the pass count at its newest sample
(passes_since), the controller re-measures lengths STALE_PASSES passes old that could still
win (controller.py), and a length measured again after that long drops its older samples.

A pass of more tokens never costs less than one of fewer (the same weights read, more rows
computed), but medians taken in different spells can say it does: adaptive at batch 1 on the
narrow bench target held T = 1 at 13.9 ms, T = 2 13.7, T = 3 11.8 (a faster minute's), T = 4
12.8, and priced a round drafting 2 below a plain round. So the table is made non-decreasing
in T (pool adjacent violators, weighted by their sample counts): such a run of lengths is
priced at its weighted mean, and the choice between them falls to what each emits.
"""

import itertools
import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

NUM_RECENT = 16  # verify samples kept per (batch size, T)
STALE_PASSES = 32  # passes at a batch size after which a length's samples are out of date
NUM_RECENT_DRAFT = 32  # (k, seconds) kept per batch size for the overhead and catch-up lines
NUM_RECENT_DRAFT_PER_K = 8  # drafting rounds kept per (batch size, k) for the draft line
DRAFT_MAX_AGE = 256  # drafting rounds at a batch size after which a k's rounds are dropped
NUM_SPEED_RATIOS = 9  # recent passes whose ratio to their own median gives the speed
MIN_SPEED_REFERENCE = 3  # samples a (batch size, length) needs before its passes give a ratio
REMEASURED_SLACK = 0.15  # a re-measure this much dearer than before is confirmed (is_trusted)
MIN_CATCH_UP_BEHIND = 4  # tokens behind a catch-up must feed to be learned (record_catch_up)
SETTLING_SAMPLES = 3  # a length's first passes at a batch size: each moves its price a lot


def _median(samples: Iterable[float]) -> float:
    """statistics.median's value (the middle one, or the mean of the middle two), without its
    checks: the controller takes a dozen medians a round, and on a GPU a round is ~1 ms."""
    ordered = sorted(samples)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


@dataclass(slots=True)
class CostModel:
    # batch size -> k -> recent (drafting round number, seconds) of drafting rounds
    draft_samples: dict[int, dict[int, deque[tuple[int, float]]]] = field(default_factory=dict)
    # batch size -> drafting rounds recorded at it
    draft_rounds: dict[int, int] = field(default_factory=dict)
    # batch size -> T -> recent seconds of verify passes, each divided by the speed it ran at
    verify_samples: dict[int, dict[int, deque[float]]] = field(default_factory=dict)
    # recent ratios of a verify pass's seconds to its (batch size, T) median: the machine's speed
    speed_ratios: deque[float] = field(default_factory=lambda: deque(maxlen=NUM_SPEED_RATIOS))
    # batch size -> recent (k, seconds) of rounds outside their forward passes
    overhead_samples: dict[int, deque[tuple[int, float]]] = field(default_factory=dict)
    # batch size -> verify passes recorded at it, and T -> that count at T's newest sample
    verify_passes: dict[int, int] = field(default_factory=dict)
    verify_newest: dict[int, dict[int, int]] = field(default_factory=dict)
    # batch size -> recent (tokens behind, seconds) of drafting rounds that first fed the
    # drafter what rounds without drafts committed, beyond the steady price of their drafting
    catch_up_samples: dict[int, deque[tuple[int, float]]] = field(default_factory=dict)
    # (batch size, tokens behind, seconds) of the engine's first drafting round, where its rows
    # fed the drafter what they were behind first: the catch-up price until one is learned
    first_catch_up: tuple[int, int, float] | None = None
    # batch size -> T -> the median its samples had when a pass after STALE_PASSES replaced them
    verify_replaced: dict[int, dict[int, float]] = field(default_factory=dict)
    # What the controller reads every round, kept until a sample it was made from changes: a
    # round records one verify pass, one drafting round and one overhead sample, and on a GPU
    # (a round of ~1 ms) refitting every line from every sample took ~0.1 ms of Python.
    # (batch size, T) -> the median of its verify samples
    _verify_medians: dict[tuple[int, int], float] = field(default_factory=dict)
    # batch size -> its verify table (_verify_table), until any verify pass (the speed moves)
    _verify_tables: dict[int, dict[int, float]] = field(default_factory=dict)
    # (batch size, k) -> (median, count, oldest round number) of k's drafting rounds young
    # enough, until one of k's is recorded or the oldest ages out (DRAFT_MAX_AGE), and batch
    # size -> the draft line, until a drafting round is recorded there (rounds age only then)
    _draft_points: dict[tuple[int, int], tuple[float, float, int]] = field(default_factory=dict)
    _draft_lines: dict[int, tuple[float, float]] = field(default_factory=dict)
    # batch size -> k -> seconds of the overhead samples in its window (oldest first), the
    # median of each, and the line through them
    _overhead_by_k: dict[int, dict[int, deque[float]]] = field(default_factory=dict)
    _overhead_medians: dict[tuple[int, int], float] = field(default_factory=dict)
    _overhead_lines: dict[int, tuple[float, float]] = field(default_factory=dict)
    # batch size -> its catch-up line (catch-ups are rare; the controller reads it each round)
    _catch_up_lines: dict[int, tuple[float, float]] = field(default_factory=dict)
    # Every drafting, verify and overhead sample recorded so far, and those of them that added
    # a batch size, a verify length or a drafting k, or replaced a length's samples: how far
    # behind the samples a price the controller keeps between rounds is (controller.py)
    records: int = 0
    new_shape_records: int = 0

    # -- recording --------------------------------------------------------------------------
    def record_draft(self, batch_size: int, num_steps: int, seconds: float) -> None:
        if num_steps > 0:
            rounds = self.draft_rounds.get(batch_size, 0) + 1
            self.draft_rounds[batch_size] = rounds
            per_k = self.draft_samples.setdefault(batch_size, {})
            self.records += 1
            if num_steps not in per_k:
                self.new_shape_records += 1
            per_k.setdefault(num_steps, deque(maxlen=NUM_RECENT_DRAFT_PER_K)).append(
                (rounds, seconds)
            )
            self._draft_points.pop((batch_size, num_steps), None)
            self._draft_lines.pop(batch_size, None)

    def draft_count(self, batch_size: int) -> int:
        """Drafting rounds whose time the draft line holds at this batch size."""
        return sum(len(samples) for samples in self.draft_samples.get(batch_size, {}).values())

    def record_catch_up(self, batch_size: int, num_steps: int, behind: int, seconds: float) -> None:
        """A drafting round of `num_steps` whose rows first fed up to `behind` tokens each:
        learned as its cost beyond drafting's steady price (all of it before that is known).
        One behind by fewer than MIN_CATCH_UP_BEHIND is not: feeding a token or two more
        costs about nothing (the first draft step feeds a chunk anyway), so what it measures
        is noise, and a line through it alone (1 token behind, 3 ms) priced feeding a
        150-token prompt at 450 ms where it cost 65."""
        if behind >= MIN_CATCH_UP_BEHIND:
            extra = max(0.0, seconds - self.draft_cost(batch_size, num_steps))
            samples = self.catch_up_samples.setdefault(batch_size, deque(maxlen=NUM_RECENT_DRAFT))
            samples.append((behind, extra))
            self._catch_up_lines.pop(batch_size, None)

    def record_first_catch_up(self, batch_size: int, behind: int, seconds: float) -> None:
        """The engine's first drafting round (the most tokens a row fed first: `behind`), which
        the lines do not learn from: it pays one-time costs (engine.py). Its time is an upper
        bound on what feeding those tokens costs, and catch_up_line prices catch-ups from it
        until one is learned. Priced at nothing instead, a new batch's prompts were free to
        feed: with the demo pair at 16 sequences of 64 tokens, a fresh engine's only batch
        (a bench's warm-up) left the line unlearned, adaptive started drafting for the next
        batch for a predicted gain of 4% a round, and paid ~20 ms feeding the drafter 16
        prompts of 218 tokens (8 plain rounds). Too high a price is
        corrected by the first catch-up learned (an exploratory round's, whose interval does
        not use this price: controller.py)."""
        if behind >= MIN_CATCH_UP_BEHIND and self.first_catch_up is None:
            self.first_catch_up = (batch_size, behind, seconds)
            self._catch_up_lines.clear()

    def record_verify(self, batch_size: int, tokens_per_seq: int, seconds: float) -> None:
        per_len = self.verify_samples.setdefault(batch_size, {})
        self.records += 1
        if tokens_per_seq not in per_len:
            self.new_shape_records += 1
        samples = per_len.setdefault(tokens_per_seq, deque(maxlen=NUM_RECENT))
        if 0 < len(samples) < SETTLING_SAMPLES:  # one of its first: a price kept from before
            # it (controller.py) may be far off, as one slow pass priced a length at 4x
            self.new_shape_records += 1
        since = self.passes_since(batch_size, tokens_per_seq)
        replaced = self.verify_replaced.setdefault(batch_size, {})
        if since is not None and since > STALE_PASSES:  # another spell's: this pass replaces them
            replaced[tokens_per_seq] = self._verify_median(batch_size, tokens_per_seq)
            samples.clear()
            self.new_shape_records += 1
        if len(samples) >= MIN_SPEED_REFERENCE:
            reference = self._verify_median(batch_size, tokens_per_seq)
            if reference > 0.0:
                self.speed_ratios.append(seconds / reference)
        samples.append(seconds / self.speed)
        self._verify_medians.pop((batch_size, tokens_per_seq), None)
        self._verify_tables.clear()
        passes = self.verify_passes.get(batch_size, 0) + 1
        self.verify_passes[batch_size] = passes
        self.verify_newest.setdefault(batch_size, {})[tokens_per_seq] = passes

    def record_overhead(self, batch_size: int, k: int, seconds: float) -> None:
        """A round's time outside its forward passes; k: the most drafts it asked a row for."""
        self.records += 1
        if batch_size not in self.overhead_samples:
            self.new_shape_records += 1
        samples = self.overhead_samples.setdefault(batch_size, deque(maxlen=NUM_RECENT_DRAFT))
        by_k = self._overhead_by_k.setdefault(batch_size, {})
        if len(samples) == samples.maxlen:  # the oldest sample leaves the window
            oldest_k = samples[0][0]
            group = by_k[oldest_k]
            group.popleft()
            if not group:
                del by_k[oldest_k]
            self._overhead_medians.pop((batch_size, oldest_k), None)
        samples.append((k, seconds))
        by_k.setdefault(k, deque()).append(seconds)
        self._overhead_medians.pop((batch_size, k), None)
        self._overhead_lines.pop(batch_size, None)

    # -- queries ----------------------------------------------------------------------------
    @property
    def speed(self) -> float:
        """Seconds a verify pass takes now over what its samples say (1: as measured), once
        MIN_SPEED_REFERENCE ratios are in: before that, one odd pass would be all of it."""
        if len(self.speed_ratios) < MIN_SPEED_REFERENCE:
            return 1.0
        return _median(self.speed_ratios)

    @property
    def has_any_verify(self) -> bool:
        return bool(self.verify_samples)

    def has_verify(self, batch_size: int, tokens_per_seq: int) -> bool:
        return tokens_per_seq in self.verify_samples.get(batch_size, {})

    def verify_count(self, batch_size: int, tokens_per_seq: int) -> int:
        """Recent passes measured at this batch size and length (at most NUM_RECENT)."""
        return len(self.verify_samples.get(batch_size, {}).get(tokens_per_seq, ()))

    def slowest_pass(self, batch_size: int, tokens_per_seq: int) -> float | None:
        """Seconds of the slowest recent pass of this length at this batch size, at the
        machine's current speed (None: never measured)."""
        samples = self.verify_samples.get(batch_size, {}).get(tokens_per_seq)
        return max(samples) * self.speed if samples else None

    def passes_since(self, batch_size: int, tokens_per_seq: int) -> int | None:
        """Verify passes at this batch size since this length's newest one (0: the last pass
        was of it), or None where it was never measured at this batch size."""
        newest = self.verify_newest.get(batch_size, {}).get(tokens_per_seq)
        return None if newest is None else self.verify_passes[batch_size] - newest

    def is_trusted(self, batch_size: int, tokens_per_seq: int, min_samples: int) -> bool:
        """Whether this length's price at this batch size is measured well enough to be its
        own floor (round_cost_floors): `min_samples` passes, or fewer since they replaced an
        older spell's (STALE_PASSES) where they came out no more than REMEASURED_SLACK above
        its price. A price too high is the error that sticks (a length priced out is never
        chosen, so never measured again; one priced too low is chosen and corrected), so a
        re-measure that found a length dearer is taken for the truth only once confirmed."""
        samples = self.verify_samples.get(batch_size, {}).get(tokens_per_seq)
        if not samples:
            return False
        if len(samples) >= min_samples:
            return True
        before = self.verify_replaced.get(batch_size, {}).get(tokens_per_seq)
        median = self._verify_median(batch_size, tokens_per_seq)
        return before is not None and median <= before * (1.0 + REMEASURED_SLACK)

    def knows_plain_cost(self, batch_size: int) -> bool:
        """Whether plain decoding's cost at this batch size is measured or can be borrowed: a
        new batch size takes the nearest measured one's curve (its ratio of T = 1 to longer
        passes), so it does not spend a plain round first. Only before any plain pass was
        measured next to a longer one is there nothing to borrow."""
        if self.has_verify(batch_size, 1):
            return True
        return any(1 in t and len(t) > 1 for t in self.verify_samples.values())

    def draft_cost(self, batch_size: int, num_steps: int) -> float:
        """Seconds to draft `num_steps` tokens per sequence at this batch size (0 before any
        drafting round was measured: optimistic, so that speculation gets tried)."""
        line = self._draft_line(batch_size) if num_steps > 0 else None
        if line is None:
            return 0.0
        return max(0.0, line[0] + line[1] * num_steps)

    def catch_up_line(self, batch_size: int, learned_only: bool = False) -> tuple[float, float]:
        """(intercept, slope per token behind) of what a drafting round pays beyond its steady
        price for feeding the drafter first (the nearest measured batch size's, its slope
        scaled to this batch size's rows: feeding is a prefill of every row's tokens). Before
        any catch-up was learned, unless `learned_only`: the engine's first drafting round's
        time per token a row fed, scaled the same way (record_first_catch_up); else (0, 0)."""
        if not self.catch_up_samples:
            first = self.first_catch_up
            if first is None or learned_only:
                return 0.0, 0.0
            rows, behind, seconds = first
            return 0.0, seconds / behind * batch_size / rows
        nearest = batch_size
        if batch_size not in self.catch_up_samples:
            nearest = _nearest_key(self.catch_up_samples, batch_size)
        line = self._catch_up_lines.get(nearest)
        if line is None:
            line = _fit_line(self.catch_up_samples[nearest])
            self._catch_up_lines[nearest] = line
        # another batch size's: its price per token behind scaled to this one's rows (a line
        # learned at 1 row, taken as it was, priced feeding 16 rows' prompts at 1/16 of it)
        return line[0], line[1] * batch_size / nearest

    def overhead_cost(self, batch_size: int, k: int) -> float:
        """Seconds a round drafting k tokens a row spends outside its forward passes."""
        line = self._overhead_line(batch_size)
        return 0.0 if line is None else max(0.0, line[0] + line[1] * k)

    def _overhead_line(self, batch_size: int) -> tuple[float, float] | None:
        """(intercept, slope) of the time outside the passes against k (the nearest measured
        batch size's), or None before any round."""
        if not self.overhead_samples:
            return None
        if batch_size not in self.overhead_samples:
            batch_size = _nearest_key(self.overhead_samples, batch_size)
        line = self._overhead_lines.get(batch_size)
        if line is None:
            line = self._fit_overhead(batch_size)
            self._overhead_lines[batch_size] = line
        return line

    def _fit_overhead(self, batch_size: int) -> tuple[float, float]:
        """Least squares through each k's median of the window, weighted by its count, robust
        to the odd slow round. One k seen (or a falling line, which is noise): flat at the
        median of all."""
        points = []
        for k, group in self._overhead_by_k[batch_size].items():
            median = self._overhead_medians.get((batch_size, k))
            if median is None:
                median = _median(group)
                self._overhead_medians[(batch_size, k)] = median
            points.append((float(k), median, float(len(group))))
        line = _weighted_line(points)
        if line is None or line[1] <= 0.0:
            return _median(s for _, s in self.overhead_samples[batch_size]), 0.0
        return line

    def verify_cost(self, batch_size: int, tokens_per_seq: int) -> float | None:
        """Seconds for one verify pass, or None before anything was measured.

        A batch size measured at a single length borrows the shape of the cost curve (cost at
        T relative to the same measured length) from the nearest batch size measured at
        several lengths, so a new batch size needs no exploratory speculative round.
        """
        curve = self._verify_curve(batch_size)
        return None if curve is None else curve(tokens_per_seq)

    def round_cost(self, batch_size: int, k: int) -> float | None:
        """Seconds for a round drafting k tokens per sequence, or None before any verify."""
        costs = self.round_costs(batch_size, k)
        return None if costs is None else costs[k]

    def round_costs(self, batch_size: int, max_k: int) -> list[float] | None:
        """[max_k + 1] round_cost(batch_size, k) for k = 0..max_k from one reading of the
        samples (the controller asks every round, and on a GPU a round takes ~1 ms), or None
        before any verify."""
        curve = self._verify_curve(batch_size)
        return None if curve is None else self._round_costs(batch_size, max_k, curve)

    def round_cost_floors(self, batch_size: int, max_k: int, min_samples: int = 1) -> list[float]:
        """[max_k + 1] the least a round drafting k tokens could cost: round_costs, with each
        verify length measured fewer than `min_samples` times at this batch size priced as
        the longest length below it measured that often (a pass does not get cheaper with
        more tokens), or as the spell it replaced priced it, where a re-measure came out
        dearer (is_trusted). A length measured once is not its own floor: one slow pass of 5
        tokens at batch 1 (11.8 ms where they took 8.2) kept k = 4 from ever being chosen or
        measured again, and adaptive drafted 3 for 200 rounds. Before any verify: zeros."""
        curve = self._verify_curve(batch_size)
        if curve is None:
            return [0.0] * (max_k + 1)
        measured = sorted(
            t
            for t in self.verify_samples.get(batch_size, {})
            if self.is_trusted(batch_size, t, min_samples)
        )
        replaced = self.verify_replaced.get(batch_size, {})
        speed = self.speed

        def floor(length: int) -> float:
            below = [t for t in measured if t <= length]
            if below and below[-1] == length:
                return curve(length)
            least = curve(below[-1]) if below else 0.0  # nothing measured below: free
            if length in replaced:
                least = max(least, min(curve(length), replaced[length] * speed))
            return least

        return self._round_costs(batch_size, max_k, floor)

    def trusted_round_costs(
        self, batch_size: int, max_k: int, min_samples: int
    ) -> list[float] | None:
        """[max_k + 1] round costs with every verify length priced from the lengths measured
        at least `min_samples` times at this batch size alone (is_trusted; interpolated
        between them, extended past them along the nearest segment), or None where none is:
        what a length measured fewer times should cost, were its few passes a slow moment's.
        Where one length is trusted, the curve takes its shape from the nearest batch size
        with two or more trusted lengths, that one among them (as _verify_curve borrows);
        None where none has: flat, it would say nothing but the floor (at batch 1 a CPU's
        pass is about flat in its length; at 16 a pass of 8 tokens cost 6.9x one)."""
        trusted = self._trusted_table(batch_size, min_samples)
        if not trusted:
            return None
        if len(trusted) == 1:
            ((length, seconds),) = trusted.items()
            shaped = {
                b: t
                for b in self.verify_samples
                if b != batch_size
                and len(t := self._trusted_table(b, min_samples)) > 1
                and length in t
            }
            if shaped:
                ref = shaped[_nearest_key(shaped, batch_size)]
                scale = seconds / max(ref[length], 1e-12)
                return self._round_costs(batch_size, max_k, lambda t: scale * _interpolate(ref, t))
            return None
        return self._round_costs(batch_size, max_k, lambda t: _interpolate(trusted, t))

    def _trusted_table(self, batch_size: int, min_samples: int) -> dict[int, float]:
        """Length -> seconds of a pass at this batch size, for its trusted lengths only
        (is_trusted), made non-decreasing in the length as _verify_table's."""
        per_len = self.verify_samples.get(batch_size, {})
        lengths = sorted(t for t in per_len if self.is_trusted(batch_size, t, min_samples))
        speed = self.speed
        medians = [self._verify_median(batch_size, t) * speed for t in lengths]
        counts = [len(per_len[t]) for t in lengths]
        return dict(zip(lengths, _monotone(medians, counts), strict=True))

    def _round_costs(
        self, batch_size: int, max_k: int, verify: Callable[[int], float]
    ) -> list[float]:
        """[max_k + 1] drafting + verify(k + 1) + the time outside the passes, k = 0..max_k."""
        draft = self._draft_line(batch_size) if max_k > 0 else None
        rest = self._overhead_line(batch_size) or (0.0, 0.0)
        costs = [verify(1) + max(0.0, rest[0])]
        for k in range(1, max_k + 1):
            drafting = 0.0 if draft is None else max(0.0, draft[0] + draft[1] * k)
            costs.append(drafting + verify(k + 1) + max(0.0, rest[0] + rest[1] * k))
        return costs

    def _verify_curve(self, batch_size: int) -> Callable[[int], float] | None:
        """Seconds of a verify pass as a function of its length at this batch size (see
        verify_cost), or None before anything was measured."""
        if not self.verify_samples:
            return None
        per_len = self._verify_table(batch_size)
        if len(per_len) == 1:
            ((length, seconds),) = per_len.items()
            shaped = {
                b: t
                for b in self.verify_samples
                if len(t := self._verify_table(b)) > 1 and length in t
            }
            if shaped:
                ref = shaped[_nearest_key(shaped, batch_size)]
                scale = seconds / ref[length]
                return lambda t: per_len[t] if t in per_len else scale * _interpolate(ref, t)
        return lambda t: _interpolate(per_len, t)

    def _verify_median(self, batch_size: int, tokens_per_seq: int) -> float:
        key = (batch_size, tokens_per_seq)
        median = self._verify_medians.get(key)
        if median is None:
            median = _median(self.verify_samples[batch_size][tokens_per_seq])
            self._verify_medians[key] = median
        return median

    def _draft_line(self, batch_size: int) -> tuple[float, float] | None:
        """(intercept, slope) of drafting's cost against its steps at this batch size (the
        nearest measured one's), or None before any drafting round."""
        if not self.draft_samples:
            return None
        if batch_size not in self.draft_samples:
            batch_size = _nearest_key(self.draft_samples, batch_size)
        line = self._draft_lines.get(batch_size)
        if line is not None:
            return line
        oldest = self.draft_rounds.get(batch_size, 0) - DRAFT_MAX_AGE
        points = []  # (k, median seconds, count) of each k's rounds young enough
        for k, samples in self.draft_samples[batch_size].items():
            point = self._draft_points.get((batch_size, k))
            if point is None or point[2] <= oldest:  # not computed, or one of them aged out
                recent = [(number, seconds) for number, seconds in samples if number > oldest]
                if not recent:
                    continue
                point = (_median(s for _, s in recent), float(len(recent)), recent[0][0])
                self._draft_points[(batch_size, k)] = point
            points.append((float(k), point[0], point[1]))
        if not points:
            return None
        line = _fit_points(points)
        self._draft_lines[batch_size] = line
        return line

    def _verify_table(self, batch_size: int) -> dict[int, float]:
        """Length -> seconds of a pass at this batch size (the nearest measured one's): each
        length's median, made non-decreasing in the length (_monotone)."""
        if batch_size not in self.verify_samples:
            batch_size = _nearest_key(self.verify_samples, batch_size)
        table = self._verify_tables.get(batch_size)
        if table is None:
            speed = self.speed
            per_len = self.verify_samples[batch_size]
            lengths = sorted(per_len)
            medians = [self._verify_median(batch_size, t) * speed for t in lengths]
            counts = [len(per_len[t]) for t in lengths]
            table = dict(zip(lengths, _monotone(medians, counts), strict=True))
            self._verify_tables[batch_size] = table
        return table


def _fit_line(samples: deque[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of seconds against steps; through the origin when
    only one step count was seen (nothing to separate the intercept from)."""
    steps = [float(k) for k, _ in samples]
    seconds = [s for _, s in samples]
    mean_k, mean_s = statistics.fmean(steps), statistics.fmean(seconds)
    var_k = sum((k - mean_k) ** 2 for k in steps)
    if var_k == 0.0:
        return 0.0, mean_s / mean_k
    slope = sum((k - mean_k) * (s - mean_s) for k, s in zip(steps, seconds, strict=True)) / var_k
    if slope <= 0.0:  # noise: fall back to the mean cost per step
        return 0.0, mean_s / mean_k
    intercept = mean_s - slope * mean_k
    if intercept < 0.0:
        return 0.0, sum(seconds) / sum(steps)
    return intercept, slope


def _weighted_line(points: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """Weighted least-squares (intercept, slope) through (k, seconds, weight) points, or None
    where k does not vary."""
    total = sum_k = sum_s = 0.0
    for k, s, w in points:
        total += w
        sum_k += k * w
        sum_s += s * w
    mean_k, mean_s = sum_k / total, sum_s / total
    var_k = cov = 0.0
    for k, s, w in points:
        var_k += w * (k - mean_k) ** 2
        cov += w * (k - mean_k) * (s - mean_s)
    if var_k == 0.0:
        return None
    slope = cov / var_k
    return mean_s - slope * mean_k, slope


def _fit_points(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """_weighted_line through (steps, seconds, weight) points; through the origin where one
    step count was seen (nothing to separate the intercept from), or where the line falls or
    crosses below zero (noise)."""
    line = _weighted_line(points)
    if line is None or line[1] <= 0.0 or line[0] < 0.0:
        return 0.0, sum(s * w for _, s, w in points) / sum(k * w for k, _, w in points)
    return line


def _monotone(values: list[float], weights: list[int]) -> list[float]:
    """The non-decreasing sequence nearest `values` in weighted least squares (pool adjacent
    violators): a run of lengths whose medians fall is priced at their weighted mean."""
    if all(a <= b for a, b in itertools.pairwise(values)):  # the usual case: nothing to pool
        return list(values)
    blocks: list[list[float]] = []  # [mean, weight, number of values]
    for value, weight in zip(values, weights, strict=True):
        blocks.append([value, float(weight), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, total, size = blocks.pop()
            previous = blocks[-1]
            joint = previous[1] + total
            previous[0] = (previous[0] * previous[1] + mean * total) / joint
            previous[1], previous[2] = joint, previous[2] + size
    return [mean for mean, _, size in blocks for _ in range(int(size))]


def _nearest_key(table: dict[int, object], key: int) -> int:
    return min(table, key=lambda k: abs(k - key))


def _interpolate(per_len: dict[int, float], length: int) -> float:
    if length in per_len:
        return per_len[length]
    lengths = sorted(per_len)
    if len(lengths) == 1:
        return per_len[lengths[0]]
    lo = max((n for n in lengths if n < length), default=lengths[0])
    hi = min((n for n in lengths if n > length), default=lengths[-1])
    if lo == hi:  # outside the measured range: extend the nearest segment
        lo, hi = (lengths[0], lengths[1]) if length < lengths[0] else (lengths[-2], lengths[-1])
    slope = (per_len[hi] - per_len[lo]) / (hi - lo)
    return max(0.0, per_len[lo] + slope * (length - lo))
