"""Speculation-length controller: how many tokens to draft, per sequence and per round.

Adaptive mode picks the round's K that maximises expected emitted tokens per second,

    sum_b E_b(min(K, cap_b))  /  round_cost(B, K),
    round_cost(B, K) = draft(B, K) + verify(B, K + 1) + overhead(B)        (cost_model.py)

against plain decoding (K = 0: B tokens per round_cost(B, 0)), from measured per-position
acceptance (per sequence, shrunk towards the engine-wide estimate) and measured costs at the
current batch size. Where speculation does not pay, K = 0: the round is plain decoding. Where
it is predicted to pay less than SPECULATION_MARGIN (3%) it is not chosen either: at such a
break-even (the wide bench target at concurrency 16, where k = 2 ran at 0.99x plain decoding)
the prediction's errors and the probes below made adaptive 0.94-0.97x plain decoding, while a
gain under 3% is not worth having.

Estimates only learn where drafts are verified, so a controller that settles on a short K
would never see whether deeper positions got better. Now and then it probes one position
further than its choice (K + 1, or K = 1 from plain decoding) to keep them current.
Costs only learn where passes run, too: a verify length never measured was interpolated
linearly between the lengths the controller's own choices had visited (T = 1 and T = K + 1,
K + 2). A CPU pass's cost is not linear in T (flat while the weights' read dominates, then a
step where the GEMM's row block or the compute takes over: the narrow bench target costs
1.00, 1.02, 1.04, 1.39, 1.50 at T = 1..5), so a line from T = 1 to T = 6 priced T = 3 at
1.2x, and in the bench (concurrency 4) adaptive drafted longer than the best fixed k (mean
acceptance length 5.5 where k = 4 won, 3.6 where k = 2 won). So every other probe is now a
cost probe (every probe at the ceiling, past which none goes deeper): the candidate length
nearest the choice that has fewer than MIN_COST_SAMPLES verify passes measured at this batch
size, if any, among the lengths that could beat the choice were their pass to cost no more
than the longest length below it measured MIN_COST_SAMPLES times (a pass does not get
cheaper with more tokens; a length measured once is not its own floor, or one slow pass
shuts it out for good: at batch 1 on the narrow bench target, one pass of 5 tokens at 11.8
ms where they took 8.2 kept k = 4 from ever being measured again, and adaptive drafted 3).
Without that bound the cost probes measured every length up to the ceiling, three times per
batch size: on the wide target at 16 sequences a pass of 7 tokens costs 5.6x a pass of 1,
and a probe there loses about three plain rounds' worth of tokens for a length that could
never pay.
Plain decoding chosen on the price of a length measured fewer than MIN_COST_SAMPLES times
is checked too, at once: that length runs again where it would win priced from the lengths
measured that often (_recheck_length). From plain decoding nothing else measures a length
but the exploratory rounds at K = 1 (below), and at batch 1 on a CPU a catch-up's price puts
those MAX_EXPLORE_EVERY rounds apart: one slow pass (torch's two threads on two cores: the pass
after a prefill now and then takes 3-4 ms where the next takes 0.6) priced drafting 4 at 8x
a plain round, and adaptive decoded plain for a whole bench, 0.98x target-only where fixed
k = 4 made 1.29x.
An acceptance probe (K + 1) runs only where its outcome could change the choice: where K + 1
would beat K were its new position always accepted and its round priced at its floor. Where a
pass of K + 2 tokens costs much more than one of K + 1 (a CPU's batch-16 pass is
compute-bound), no acceptance there can pay for it, and the probe every PROBE_EVERY rounds
only lost time.
A measured length goes out of date, too: the machine's speed drifts, and not alike for every
length (cost_model.py). Adaptive at 16 sequences on the wide target kept a T = 1 and a T = 2
measured in a slow minute and drafted 4 where k = 2 paid. could_win does not help there: it
looks for lengths that could win at their floors, and a measured length's floor is its own
(old) price. So a length whose newest pass is STALE_PASSES passes old at this batch size is a
cost probe's candidate again where it would win were its round STALE_SLACK cheaper than
priced, plain decoding included (at the break-even concurrencies; never where speculation pays
2x), at most once every STALE_PASSES passes: the one nearest to winning at its price (the
oldest among equals) of those not probed yet in the current round of them (the nearest alone
would be out of date again by the next probe, and the others never measured). On a steady
machine, probing every candidate as it went stale spent ~8% of the rounds on lengths up to
15% worse; once every STALE_PASSES passes, a probe loses at most STALE_SLACK of one round in
32 (~1%). STALE_SLACK was 15%, and the oldest candidate went first: on the narrow bench
target at 4 sequences of code, the 3-token pass measured 7.2 ms in its first three passes
where fixed k = 2's took 5.4-6.1; priced so, k = 2 would win only ~15% cheaper (at the edge
of the slack), adaptive drafted 4-5 for the whole run and made 0.950x k = 2 in two benches.
Where k = 2 was a candidate, lengths priced longer ago went first, one every STALE_PASSES
passes, in a run of ~90 passes at 4 sequences. In a model of that case
(tests/engine/test_units.py: the 3-token pass priced 20% dear), the first out-of-date probe
now measures it and k = 2 wins from there, where k = 1 went first and k = 2 waited another
STALE_PASSES passes; priced 32% dear, k = 2 was never measured again at 15%.
From plain decoding the probe is an exploratory round at K = 1, at most every EXPLORE_EVERY
rounds, and no more often than keeps its predicted loss (the round's cost minus the time plain
decoding takes to emit the tokens it is expected to) within EXPLORE_BUDGET of the time spent in
plain rounds since the last one. Where a speculative round costs many plain rounds (sampled
requests on an H200, whose draft steps are host-bound: a K = 1 round at 16 sequences took 15
ms against 3.2 for a plain one), one every 16 rounds made adaptive 0.75x plain decoding; where
it costs little (a CPU), the rule changes nothing.
An exploratory round also feeds the drafter first what the plain rounds since the last one
committed (a catch-up). At 32 sequences on the wide bench target (CPU) a K = 1 round after 16
plain ones drafted for 22 ms where a steady drafting step costs 4.8, and lost ~64 ms where
34 were predicted; worse, drafting's price was never learned there at all (every drafting
round was a catch-up, which the draft line rightly leaves out), so it was priced 0. The cost
model now learns catch-ups apart, as a line in the tokens behind (cost_model.py), and the
interval grows until the budget covers the exploratory round and its catch-up: where
feeding one plain round's tokens costs more than the budget's share of that round, no
interval does, and exploration waits MAX_EXPLORE_EVERY rounds. A draft model takes a new
sequence's prompt at its first drafts, not at admission (draft_model.py): where plain
decoding wins until the sequence ends, its prefill is not paid at all.
Until the engine-wide estimate rests on MIN_EXPLORE_EVIDENCE drafts at position 1 (or
MIN_EXPLORE_ROUNDS rounds' worth at a smaller batch: at batch 1, 64 drafts would take 64
exploratory rounds), though, exploring keeps the EXPLORE_EVERY pace, whatever its price: the
estimate that chose plain decoding is then a few rounds' worth, and with exploring put off it
is never corrected. On
the wide bench target at 16 sequences of prose (CPU), the warm-up batch's first round and two
exploratory rounds, 42 drafts over 8 distinct prompts, estimated position 1 at 0.71 where
fixed k = 2 measured 0.90 over 370; priced at 0.71, k = 2 lost to plain decoding, the catch-up
put exploring MAX_EXPLORE_EVERY rounds apart, and adaptive decoded plain for the rest of the
bench, behind k = 2 by 4%. The price of the rule is a few exploratory rounds once in an
engine's life (the estimate forgets by GLOBAL_DECAY a draft, and only as new ones come in).
Starting to draft has a price of its own: the first drafting round for a
sequence feeds the drafter what it is behind, its prompt if it never drafted, what plain
rounds committed since it last did. At 16 sequences on the narrow bench target (CPU),
adaptive went from plain decoding to K = 1 a few rounds before the batch's end, for a
predicted gain of 4% a round, and paid ~70 ms feeding 260 tokens a row (3.5 plain rounds)
for it. The catch-up line prices that feeding (a + p * the most tokens a row is behind), and
each speculative length pays it spread over the tokens the batch has left to generate: a
round emitting t tokens is charged t / (tokens left) of it. Near the end of a batch, or
with a long backlog, a small gain is not worth starting for; where much is left, it is.
The choice is Python, ~0.1 ms of it a round inside an engine (a cold cache after the passes):
where a round takes 1-3 ms (the demo-size targets on a GPU, the demo pair on a CPU) that was
3-5% of adaptive's time, and fixed k beat it by as much at the same k. So the cost model keeps
its lines and tables between rounds (cost_model.py), the controller keeps the round prices it
read for a few rounds' samples (_round_costs), a speculative choice is kept for up to
KEEP_CHOICE_ROUNDS rounds of the same batch, its probes included (_keeps_speculating), and a
plain one until its next exploration or until plain rounds get dear enough to lose
(_keeps_plain). With the demo pair on a CPU (rounds of ~1 ms at batch 1, as the demo-size
targets' on an H200), the choice took 37-132 us a round at 1, 4 and 16 sequences (~85 us in
full at batch 1, made 1 round in 3; every plain round at 4 sequences made it in full), now
19-43 us; adaptive over target-only, paired, 1.02-1.07x what it was at 5 of 6 cells (code and
prose), 0.99x at the sixth.
A sequence's own estimate is shrunk towards the engine-wide one by PRIOR_WEIGHT
pseudo-rounds: a couple of unlucky rejections must not talk a sequence out of speculating.
The engine-wide estimate, which every sequence's rounds feed, leans on INITIAL_ALPHA by one
pseudo-round only: at 8 (as a sequence's) a short run's deep positions stayed pulled towards
0.6 where prose accepts ~0.9 there, and the controller drafted 5 where 6 paid.
Each position of it leans on the position before it, not on a flat INITIAL_ALPHA
(AcceptanceEstimate.chained_alphas): a position past the controller's habitual K is reached
only by its probes, so its estimate was mostly that prior, 0.6, where the demo pair's
conditional acceptance is 0.77-0.85 (code) and 0.80-0.91 (prose) at every depth to 6, no
lower deep than shallow (a run accepted so far is in easy text). On the narrow bench target
at 4 sequences of prose, k = 2, 4 and 6 were within 4% of each other and k = 6 won; adaptive
priced k = 6's last positions at 0.6, stayed at k = 2 and made 0.965-0.974x k = 6 in three
runs; with the chained prior it drafts 5-6 and makes 0.985-0.987x. An unseen position is
priced at the rate of the deepest seen; if that is too high, the rounds that go there
measure it.
"""

import math
import time
from dataclasses import dataclass, field

from daemon.runtime.engine.acceptance import AcceptanceEstimate, accept_probs
from daemon.runtime.engine.cost_model import SETTLING_SAMPLES, STALE_PASSES, CostModel

PRIOR_WEIGHT = 8.0  # pseudo-observations of the engine-wide estimate in a sequence's estimate
GLOBAL_PRIOR_WEIGHT = 1.0  # pseudo-observations of INITIAL_ALPHA in the engine-wide estimate
SEQUENCE_DECAY = 0.95  # weight kept by a sequence's old observations at each of its rounds
GLOBAL_DECAY = 0.998  # the same for the engine-wide estimate, updated by every sequence
INITIAL_ALPHA = 0.6  # before anything is measured: optimistic enough to try speculation
MIN_ACCEPT_PROB = 0.02  # a sequence stops drafting at positions less likely than this
EXPLORE_EVERY = 16  # rounds at K = 0 between two exploratory speculative rounds, at least
EXPLORE_BUDGET = 0.02  # their predicted loss, as a share of the time in plain rounds between
MAX_EXPLORE_EVERY = 512  # ... but never more rounds than this apart (a loss mispredicted)
MIN_EXPLORE_EVIDENCE = 64.0  # drafts at position 1 the engine-wide estimate rests on, at least,
# before an exploratory round's price may put exploring off (_best_k) ...
MIN_EXPLORE_ROUNDS = 4  # ... or this many rounds' worth at the batch size, where fewer
PROBE_EVERY = 8  # rounds at K > 0 between two probes (K + 1, or an unmeasured length)
KEEP_CHOICE_ROUNDS = 8  # rounds of the same batch a speculative choice is made for at most
KEEP_CHOICE_SHARE = 0.01  # ... where making it took this share of its round's price or more
MIN_COST_SAMPLES = SETTLING_SAMPLES  # passes of a length, per batch size, to trust its cost
STALE_SLACK = 0.30  # an out-of-date length is measured again if this much cheaper would win
SPECULATION_MARGIN = 0.03  # speculation must beat plain decoding's predicted rate by this much
PRICE_LAG_RECORDS = 16  # cost samples (five rounds' or more) a kept round price may lag behind


@dataclass(slots=True)
class ControllerConfig:
    max_k: int = 8
    adaptive: bool = True
    fixed_k: int = 4  # used when not adaptive

    def __post_init__(self) -> None:
        if not 0 <= self.fixed_k <= self.max_k:
            raise ValueError(f"fixed k must be in [0, {self.max_k}], got {self.fixed_k}")


@dataclass(slots=True)
class SpeculationController:
    config: ControllerConfig
    costs: CostModel = field(default_factory=CostModel)
    global_estimate: AcceptanceEstimate = field(init=False)
    _rounds_without_spec: int = 0
    _rounds_since_probe: int = 0
    _cost_probe_next: bool = False  # probes alternate: acceptance (K + 1), then cost
    # the last choice's expected tokens for each k, the rate it chose and its round costs
    # (k = 0..; None: it had no costs to compare): a cost probe is worth a length only if it
    # could beat that rate
    _last_choice: tuple[list[float], float, list[float]] | None = None
    # plain rounds an exploratory round must wait for (EXPLORE_EVERY unless it costs more)
    _explore_every: int = EXPLORE_EVERY
    # batch size -> (the cost model's records, and its new-shape records, when they were
    # priced; round costs for k = 0..max_k): _round_costs
    _prices: dict[int, tuple[int, int, list[float]]] = field(default_factory=dict)
    # the estimates of a batch for which plain decoding was chosen with every cost known:
    # until its next exploratory round no estimate moves (no drafts), and the same batch
    # keeps the choice without recomputing it (at 16 sequences the choice took ~0.24 ms of
    # Python a round, 8% of a plain GPU round) while a plain round's price stays at or below
    # _plain_flip_cost, the price at which the best speculative rate would have won
    _plain_batch: list[AcceptanceEstimate] | None = None
    _plain_flip_cost: float = 0.0
    # batch size -> the verify pass count at its latest probe of an out-of-date length, and
    # the lengths probed so in the current round of them (_cost_probe_length)
    _stale_probed: dict[int, int] = field(default_factory=dict)
    _stale_round: dict[int, set[int]] = field(default_factory=dict)
    # (batch size, verify length, its sample count then) of every recheck (_recheck_length)
    _rechecked: set[tuple[int, int, int]] = field(default_factory=set)
    # the batch for which a speculative K was last chosen (not a probe), K, each sequence's
    # cap then, and the rounds since: the same batch keeps that choice for up to
    # KEEP_CHOICE_ROUNDS rounds without making it again (_keeps_speculating)
    _kept_batch: list[AcceptanceEstimate] | None = None
    _kept_k: int = 0
    _kept_caps: list[int] = field(default_factory=list)
    _kept_rounds: int = 0

    def __post_init__(self) -> None:
        self.global_estimate = AcceptanceEstimate(self.config.max_k, decay=GLOBAL_DECAY)

    def new_estimate(self) -> AcceptanceEstimate:
        return AcceptanceEstimate(self.config.max_k, decay=SEQUENCE_DECAY)

    def choose(
        self,
        estimates: list[AcceptanceEstimate],
        limits: list[int],
        behind: list[int] | None = None,
        left: list[int] | None = None,
    ) -> list[int]:
        """k per sequence; `limits[b]` caps k_b (context left, tokens left to generate).
        behind[b]: tokens sequence b's drafter must take before it drafts (its prompt, if it
        never drafted; what plain rounds committed since it last did); left[b]: tokens it may
        still generate (both unknown: nothing to feed, no end in sight)."""
        if not self.config.adaptive:
            return [min(self.config.fixed_k, limit) for limit in limits]
        if self._keeps_plain(estimates, limits):
            self._rounds_without_spec += 1
            return [0] * len(estimates)
        if self._keeps_speculating(estimates):
            self._kept_rounds += 1
            kept_k, caps = self._kept_k, self._kept_caps
            # the probes stay on schedule, priced from the kept choice's reading
            k = self._explore(kept_k, max(limits, default=0), len(estimates), max(caps))
            if k > kept_k:  # a probe (as below)
                return [min(k, limit) for limit in limits]
            return [min(k, cap, limit) for cap, limit in zip(caps, limits, strict=True)]
        started = time.perf_counter()
        self._plain_batch = None
        self._kept_batch = None
        prior = self._prior()
        probs = [accept_probs(e.alphas(prior, PRIOR_WEIGHT)) for e in estimates]
        caps = [min(limit, _useful_len(p)) for p, limit in zip(probs, limits, strict=True)]
        switch = self._switch_price(len(estimates), behind, left)
        best_k = self._best_k(probs, caps, switch)
        if best_k == 0 and (recheck := self._recheck_length(len(estimates), caps, switch)):
            self._rounds_without_spec = 0  # it drafts: an exploration's work, and more
            return [min(recheck, cap) for cap in caps]
        k = self._explore(best_k, max(limits, default=0), len(estimates), max(caps, default=0))
        if (  # not a probe of plain, nor a choice a recheck may overturn once plain's price
            # is trusted (_recheck_length)
            k == 0
            and best_k == 0
            and self._last_choice is not None
            and self.costs.is_trusted(len(estimates), 1, MIN_COST_SAMPLES)
        ):
            self._plain_batch = list(estimates)
            self._plain_flip_cost = self._flip_cost(len(estimates), switch)
        if k > best_k:  # a probe: past where the estimates stop drafting too (else it never
            # learns that a position got better), within the limits
            return [min(k, limit) for limit in limits]
        if k > 0 and k == best_k and self._last_choice is not None:  # a priced choice
            spent = time.perf_counter() - started
            if spent >= KEEP_CHOICE_SHARE * self._last_choice[2][k]:  # worth keeping
                self._kept_batch, self._kept_k, self._kept_caps = list(estimates), k, caps
                self._kept_rounds = 0
        return [min(k, cap) for cap in caps]

    def _keeps_speculating(self, estimates: list[AcceptanceEstimate]) -> bool:
        """Whether this round keeps the last speculative choice (made for the same batch, in
        order, fewer than KEEP_CHOICE_ROUNDS rounds ago): the choice took ~0.1 ms of Python a
        round in an engine (a GPU round of the demo-size targets takes ~1 ms; at batch 1 on a
        CPU adaptive's rounds were 0.1-0.15 ms slower than fixed k's at the same k), while a
        round moves a sequence's estimate by at most 5% of a round's weight (SEQUENCE_DECAY)
        and a length's price by one sample of NUM_RECENT: a choice made a few rounds ago is
        the choice of now, or about as good. New sequences and finished ones make it again at
        once. A probe due in a kept round is decided from the kept choice's reading (it made
        the choice in full, and so did the round after it: with keeping for 4 rounds, 3 rounds
        in 8 at batch 1 made it in full). Kept for 8 rounds rather than 4, the choices of a
        simulated controller over the demo pair's measured draft agreement emitted as many
        tokens a ms (within 1-2%, either way, code and prose). Only where making the choice
        took KEEP_CHOICE_SHARE of the round's price or more is it kept at all: in a round of
        10 ms or more there is little to save, and the choice of each round is the best one."""
        kept = self._kept_batch
        return (
            kept is not None
            and self._kept_rounds + 1 < KEEP_CHOICE_ROUNDS
            and len(kept) == len(estimates)
            and all(a is b for a, b in zip(kept, estimates, strict=True))
        )

    def _flip_cost(self, batch: int, switch: float) -> float:
        """The plain round's price above which the last choice's best speculative rate would
        beat plain decoding by the margin (inf: no speculative length was priced); each rate
        pays the switch price as _best_k's did. Left out, a batch whose drafter was behind (after
        plain rounds, its rows are) flipped at a price below the one it chose plain at, and
        each of its plain rounds made the choice again: with the demo pair at 4 sequences,
        185 of 291 plain rounds. Plain rounds only put the drafter further behind and leave
        fewer tokens to spread its catch-up over, so the switch price of the choice is a
        floor of theirs."""
        assert self._last_choice is not None
        tokens, _, costs = self._last_choice
        rates = [tokens[k] / max(costs[k] + switch * tokens[k], 1e-9) for k in range(1, len(costs))]
        best = max(rates, default=0.0)
        return (1.0 + SPECULATION_MARGIN) * batch / best if best > 0.0 else math.inf

    def _keeps_plain(self, estimates: list[AcceptanceEstimate], limits: list[int]) -> bool:
        """Whether this round is another plain round of the batch that last chose plain
        decoding (the same estimates, in order), short of its next exploratory round, with
        plain rounds still priced where that choice stands."""
        kept = self._plain_batch
        return (
            kept is not None
            and len(kept) == len(estimates)
            and self._rounds_without_spec + 1 < self._explore_every
            and max(limits, default=0) > 0
            and all(a is b for a, b in zip(kept, estimates, strict=True))
            and (self._round_costs(len(estimates), 0) or [0.0])[0] <= self._plain_flip_cost
        )

    def _round_costs(self, batch: int, max_k: int) -> list[float] | None:
        """Round costs at this batch size for k = 0..max_k or more (CostModel.round_costs), kept
        while the cost model has recorded fewer than PRICE_LAG_RECORDS samples since, none of
        them of a new batch size, length or k. Pricing every round from its samples took
        30-50 us of Python in an engine (a cold cache after the passes; 65 us for a whole
        choice), and a kept plain choice priced plain rounds every round too: with the demo
        pair on a CPU, where a round takes ~1 ms as the demo-size targets' do on an H200,
        adaptive's plain rounds cost 0.88 ms where target-only's cost 0.81. One round's samples
        move a price by about one sample of NUM_RECENT: a price a few rounds old is the price
        of now. A new shape (a length first measured, a spell's samples replaced) moves it at
        once."""
        costs = self.costs
        kept = self._prices.get(batch)
        if (
            kept is not None
            and kept[1] == costs.new_shape_records
            and costs.records - kept[0] < PRICE_LAG_RECORDS
            and len(kept[2]) > max_k
        ):
            return kept[2]
        priced = costs.round_costs(batch, max(max_k, self.config.max_k))
        if priced is not None:
            self._prices[batch] = (costs.records, costs.new_shape_records, priced)
        return priced

    def _explore(self, best_k: int, max_k: int, batch: int, max_cap: int) -> int:
        """Now and then one position further than the estimates say, to keep them current;
        every other time, a length whose verify cost is not measured yet (if any)."""
        if best_k == 0 and max_k > 0:
            self._rounds_without_spec += 1
            if self._rounds_without_spec >= self._explore_every:
                self._rounds_without_spec = 0
                return 1
            return 0
        self._rounds_without_spec = 0
        if best_k > 0:
            self._rounds_since_probe += 1
            if self._rounds_since_probe >= PROBE_EVERY:
                self._rounds_since_probe = 0
                self._cost_probe_next = not self._cost_probe_next
                # none past the ceiling, nor where its outcome could not change the choice
                deeper = best_k + 1
                if deeper > max_k or not self._deeper_could_win(deeper, batch):
                    deeper = None
                if self._cost_probe_next or deeper is None:
                    length = self._cost_probe_length(best_k, batch, max_cap)
                    if length is not None:
                        return length
                if deeper is not None:
                    return deeper
        return best_k

    def _cost_probe_length(self, best_k: int, batch: int, max_cap: int) -> int | None:
        """A length to measure (None: none). First the k nearest best_k (shorter first) whose
        verify pass (k + 1 tokens) has fewer than MIN_COST_SAMPLES measurements at this batch
        size and could win (could_win), plain decoding (0) among them where its price is not
        trusted yet (cost_model.is_trusted: one pass at a slow moment priced plain decoding at
        44.6 ms where its passes took 33, and adaptive drafted at a loss) and would win at its
        floor. Else, at most once every STALE_PASSES passes, of the lengths whose newest pass
        is more than STALE_PASSES passes old and that would win were their round STALE_SLACK
        cheaper than priced, plain decoding (0) included, the one whose priced rate is nearest
        the choice's (the oldest among equals) that this round of them has not probed yet:
        one such probe loses at most STALE_SLACK of a round. A round ends when every candidate
        was probed in it (or is no longer one)."""
        could_win = self.could_win(batch, max_cap)
        unmeasured = [
            k
            for k in range(1, max_cap + 1)
            if k != best_k
            and self.costs.verify_count(batch, k + 1) < MIN_COST_SAMPLES
            and (could_win is None or k in could_win)
        ]
        if best_k > 0 and not self.costs.is_trusted(batch, 1, MIN_COST_SAMPLES):
            # plain decoding's price is one pass, or a re-measure that came out dearer
            floor = self.costs.round_cost_floors(batch, 0, MIN_COST_SAMPLES)[0]
            if self._last_choice is None or batch / max(floor, 1e-9) > self._last_choice[1]:
                unmeasured.append(0)
        if unmeasured:
            return min(unmeasured, key=lambda k: (abs(k - best_k), k))
        passes = self.costs.verify_passes.get(batch, 0)
        if passes - self._stale_probed.get(batch, -STALE_PASSES - 1) <= STALE_PASSES:
            return None
        stale = [
            k
            for k in range(0 if best_k > 0 else 1, max_cap + 1)
            if k != best_k and self._is_stale(batch, k + 1) and self._wins_if_cheaper(k)
        ]
        if not stale:
            return None
        self._stale_probed[batch] = passes
        # a round of the candidates, nearest to winning first: the nearest alone would be
        # out of date again by the next probe, and the others never measured
        done = self._stale_round.setdefault(batch, set())
        if not (fresh := [k for k in stale if k not in done]):
            done.clear()
            fresh = stale
        assert self._last_choice is not None  # _wins_if_cheaper found candidates with it
        tokens, _, costs = self._last_choice
        length = max(
            fresh,
            key=lambda k: (
                tokens[k] / max(costs[k], 1e-9),
                self.costs.passes_since(batch, k + 1) or 0,
                -k,
            ),
        )
        done.add(length)
        return length

    def _recheck_length(self, batch: int, caps: list[int], switch: float) -> int | None:
        """Where plain decoding was just chosen: a k whose verify length at this batch size
        was measured, but not enough to be trusted (is_trusted: MIN_COST_SAMPLES passes),
        that would beat the choice were its pass to cost what the trusted lengths say
        (trusted_round_costs; the switch price paid as _best_k pays it), the most promising;
        None where there is none, or where plain decoding's own price is not trusted yet.
        One slow pass must not price a length out for good: with the demo pair at batch 1 on
        the CPU (torch's two threads on two cores), the pass after a prefill now and then
        takes 3-4 ms where the next takes 0.6. Where that pass was the first of 5 tokens,
        drafting 4 was priced at 8x a plain round; plain decoding won, and from it nothing
        measures a length again but the exploratory rounds at K = 1, which a catch-up's price
        there puts MAX_EXPLORE_EVERY rounds apart: adaptive decoded plain for the whole bench
        (0.98x target-only where k = 4 made 1.29x). A length is rechecked once per sample
        count it has (so at most MIN_COST_SAMPLES - 1 times, and not again where its round
        drafted less than asked: a proposer may, an n-gram's miss, a drafter out of room)
        before its price is trusted, for better or worse. Priced at its floor
        (round_cost_floors) instead, a length is rechecked too hopefully: at 16 sequences
        (the demo pair, CPU) a pass of 4 tokens measured twice, between a trusted 1 (2.4 ms)
        and 5 (7.7), was rechecked at 2.4, and the recheck fed the drafter 16 new prompts
        first (27 ms, 11 plain rounds). Where plain decoding is the only length trusted and
        no batch size lends a curve, its floor is all there is: then only a length with a
        pass that cannot be true is rechecked, a pass of T tokens dearer than T plain passes
        (a fresh engine's first round at 16 sequences measured 8 tokens once, at 6.9x one
        token and truly so, and two rechecks there lost ~11 plain rounds)."""
        if self._last_choice is None or not self.costs.is_trusted(batch, 1, MIN_COST_SAMPLES):
            return None
        tokens, best_rate, _ = self._last_choice
        max_k = min(max(caps, default=0), len(tokens) - 1)
        candidates = [
            (k, count)
            for k in range(1, max_k + 1)
            if (count := self.costs.verify_count(batch, k + 1)) > 0
            and (batch, k + 1, count) not in self._rechecked
            and not self.costs.is_trusted(batch, k + 1, MIN_COST_SAMPLES)
        ]
        if not candidates:
            return None
        costs = self.costs.trusted_round_costs(batch, max_k, MIN_COST_SAMPLES)
        if costs is None:  # plain decoding alone trusted, and no curve to borrow
            plain = self.costs.verify_cost(batch, 1) or 0.0
            candidates = [
                (k, count)
                for k, count in candidates
                if (self.costs.slowest_pass(batch, k + 1) or 0.0) > (k + 1) * plain
            ]
            costs = self.costs.round_cost_floors(batch, max_k, MIN_COST_SAMPLES)
        best, best_trusted_rate = None, best_rate
        for k, count in candidates:
            rate = tokens[k] / max(costs[k] + switch * tokens[k], 1e-9)
            if rate > best_trusted_rate:
                best, best_trusted_rate = (k, count), rate
        if best is None:
            return None
        self._rechecked.add((batch, best[0] + 1, best[1]))
        return best[0]

    def _deeper_could_win(self, k: int, batch: int) -> bool:
        """Whether drafting k, one past the choice, could beat it were the new position always
        accepted and its round priced at its floor: else what an acceptance probe there learns
        cannot change the choice, and the probe only costs (on the wide target at 16 sequences
        a pass of 4 tokens costs 1.3x a pass of 3: a probe every 8 rounds cost ~2%)."""
        if self._last_choice is None or k < 2:
            return True
        tokens, best_rate, _ = self._last_choice
        if k - 1 >= len(tokens):
            return True
        # position k accepted whenever reached: the tokens of k - 1, plus as many again as
        # the sequences' chance of reaching it (what position k - 1 added)
        optimistic = 2.0 * tokens[k - 1] - tokens[k - 2]
        floor = self.costs.round_cost_floors(batch, k, MIN_COST_SAMPLES)[k]
        return optimistic / max(floor, 1e-9) > best_rate

    def _is_stale(self, batch: int, tokens_per_seq: int) -> bool:
        since = self.costs.passes_since(batch, tokens_per_seq)
        return since is not None and since > STALE_PASSES

    def _wins_if_cheaper(self, k: int) -> bool:
        """Whether k would beat the last choice's rate were its round STALE_SLACK cheaper
        than priced (its price was measured: no floor bounds it from below)."""
        if self._last_choice is None:
            return False
        tokens, best_rate, costs = self._last_choice
        if k >= len(costs):
            return False
        return tokens[k] * (1.0 + STALE_SLACK) / max(costs[k], 1e-9) > best_rate

    def observe(self, estimate: AcceptanceEstimate, num_drafted: int, num_accepted: int) -> None:
        if num_drafted:  # the estimates move: a kept plain choice is made again
            self._plain_batch = None
        estimate.update(num_drafted, num_accepted)
        self.global_estimate.update(num_drafted, num_accepted)

    def _prior(self) -> list[float]:
        return self.global_estimate.chained_alphas(INITIAL_ALPHA, GLOBAL_PRIOR_WEIGHT)

    def _switch_price(self, batch: int, behind: list[int] | None, left: list[int] | None) -> float:
        """Seconds per emitted token that drafting must also pay, once, to start: its first
        round feeds the drafter the tokens it is behind (a + p * the most behind, the learned
        catch-up line), spread over the tokens the batch has left to generate (the module
        doc says why). 0 where no row is behind or none has tokens left."""
        if not behind or not left or batch <= 0:
            return 0.0
        most = max(behind)
        remaining = sum(left)
        if most <= 0 or remaining <= 0:
            return 0.0
        intercept, slope = self.costs.catch_up_line(batch)
        return max(0.0, intercept + slope * most) / remaining

    def _best_k(self, probs: list[list[float]], caps: list[int], switch: float = 0.0) -> int:
        batch = len(probs)
        self._last_choice = None
        self._explore_every = EXPLORE_EVERY
        if not self.costs.has_any_verify:  # nothing measured yet: speculate, and measure that
            return max(caps, default=0)
        if not self.costs.knows_plain_cost(batch):  # plain decoding never measured: measure it
            return 0
        max_cap = max(caps, default=0)
        priced = self._round_costs(batch, max_cap)
        assert priced is not None
        costs = priced[: max_cap + 1]  # [max_cap + 1], k = 0..max_cap
        # where speculation is predicted to pay less than the margin, its prediction's errors
        # and its probes would lose more than it can gain: plain decoding
        best_k, best_rate = 0, (1.0 + SPECULATION_MARGIN) * batch / max(costs[0], 1e-9)
        tokens = _expected_tokens_by_k(probs, caps, max_cap)
        for k in range(1, max_cap + 1):
            rate = tokens[k] / max(costs[k] + switch * tokens[k], 1e-9)
            if rate > best_rate:
                best_k, best_rate = k, rate
        self._last_choice = (tokens, best_rate, costs)
        # learned catch-ups only: an exploratory round is what learns one where the engine's
        # first round stands in for it, and that round's one-time costs (on an H200, 134 ms
        # for 7 steps that later took ~1.3 ms each) would put exploring off for good
        catch_up = self.costs.catch_up_line(batch, learned_only=True)
        evidence = min(MIN_EXPLORE_EVIDENCE, MIN_EXPLORE_ROUNDS * batch)
        if self.global_estimate.reached[0] >= evidence:
            self._explore_every = _exploration_interval(tokens, costs, batch, catch_up)
        return best_k

    def could_win(self, batch: int, max_k: int) -> set[int] | None:
        """The k up to max_k that would beat the last choice were each verify length measured
        fewer than MIN_COST_SAMPLES times at this batch size to cost what the longest length
        below it measured that often does (None: the last choice had no costs to compare)."""
        if self._last_choice is None:
            return None
        tokens, best_rate, _ = self._last_choice
        max_k = min(max_k, len(tokens) - 1)
        floors = self.costs.round_cost_floors(batch, max_k, MIN_COST_SAMPLES)
        return {k for k in range(1, max_k + 1) if tokens[k] / max(floors[k], 1e-9) > best_rate}


def _exploration_interval(
    tokens: list[float], costs: list[float], batch: int, catch_up: tuple[float, float]
) -> int:
    """Plain rounds between two exploratory rounds at K = 1: EXPLORE_EVERY, or as many, n, as
    keep the exploratory round's predicted loss within EXPLORE_BUDGET of the n plain rounds'
    time; at most MAX_EXPLORE_EVERY. Its loss is its cost beyond what plain decoding pays for
    the same tokens, costs[1] - tokens[1] * costs[0] / batch, plus its catch-up: the drafter
    first feeds the n tokens each row committed meanwhile, a + p * n (`catch_up`, learned).
    Where p alone is over the budget's share of a plain round, no interval keeps the loss
    within it: MAX_EXPLORE_EVERY. A new sequence's prompt, which the drafter also takes at
    its first drafts, is not charged to exploring: it is the price of speculating for that
    sequence at all, whenever that starts (charged, it kept a remote TP drafter's verifier
    from exploring within a whole batch)."""
    if len(costs) < 2 or costs[0] <= 0.0 or batch <= 0:
        return EXPLORE_EVERY
    fixed = costs[1] - tokens[1] * costs[0] / batch + catch_up[0]
    margin = EXPLORE_BUDGET * costs[0] - catch_up[1]  # per plain round between two
    if margin <= 0.0:
        return MAX_EXPLORE_EVERY
    needed = math.ceil(fixed / margin) if fixed > 0.0 else 0
    return min(MAX_EXPLORE_EVERY, max(EXPLORE_EVERY, needed))


def _expected_tokens_by_k(probs: list[list[float]], caps: list[int], max_k: int) -> list[float]:
    """[max_k + 1] expected tokens a round emits over the batch when it asks each sequence
    for k drafts (sequence b drafts min(k, caps[b])): sum_b expected_tokens(probs[b], ...).
    One pass per sequence: the rounds are chosen every step, and on a GPU a step is ~1 ms."""
    tokens = [float(len(probs))] * (max_k + 1)
    for p, cap in zip(probs, caps, strict=True):
        running = 0.0
        for k in range(1, max_k + 1):
            if k <= cap:
                running += p[k - 1]
            tokens[k] += running
    return tokens


def _useful_len(probs: list[float]) -> int:
    """Drafting stops at the first position whose acceptance chance is negligible (>= 1)."""
    useful = sum(1 for p in probs if p >= MIN_ACCEPT_PROB)
    return max(1, useful)
