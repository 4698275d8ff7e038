"""Unit tests of the engine's model-free parts: n-gram lookup, stop checks, the controller."""

import itertools
import math
import random

import pytest
import torch

from daemon.runtime.engine.acceptance import AcceptanceEstimate, accept_probs, expected_tokens
from daemon.runtime.engine.controller import (
    EXPLORE_EVERY,
    MAX_EXPLORE_EVERY,
    MIN_COST_SAMPLES,
    MIN_EXPLORE_EVIDENCE,
    MIN_EXPLORE_ROUNDS,
    PROBE_EVERY,
    ControllerConfig,
    SpeculationController,
)
from daemon.runtime.engine.cost_model import (
    DRAFT_MAX_AGE,
    MIN_CATCH_UP_BEHIND,
    SETTLING_SAMPLES,
    STALE_PASSES,
    CostModel,
)
from daemon.runtime.engine.stop import (
    FINISH_LENGTH,
    FINISH_STOP,
    STOP_WINDOW_SLACK,
    StopChecker,
    truncate_at_stop,
)
from daemon.runtime.errors import RequestError
from daemon.runtime.proposers.base import ProposeRequest
from daemon.runtime.proposers.ngram import NgramProposer
from daemon.runtime.sampling.params import SamplingParams


def test_ngram_lookup_prefers_longest_and_latest_match() -> None:
    prop = NgramProposer(max_ngram=3)
    assert prop.lookup([1, 2, 3, 4, 9, 1, 2, 3], 3) == [4, 9, 1]
    assert prop.lookup([7, 1, 5, 2, 1, 6, 2, 1], 2) == [6, 2]  # latest "2 1" -> 6 wins over 5
    assert prop.lookup([1, 2, 3], 2) == []
    assert prop.lookup([5], 4) == []


def test_ngram_propose_respects_k_per_sequence() -> None:
    prop = NgramProposer()
    req = ProposeRequest(
        slots=[0, 1, 2],
        token_ids=[[1, 2, 3, 1, 2], [4, 5, 6], [1, 1, 1, 1]],
        num_to_draft=[2, 3, 0],
        params=[SamplingParams()] * 3,
        draft_seeds=[0] * 3,
    )
    out = prop.propose(req)
    assert out.num_draft_tokens == [2, 0, 0]
    assert out.draft_token_ids[0, :2].tolist() == [3, 1]
    assert out.sparse_ids is None


def _checker(**kw: object) -> StopChecker:
    params = SamplingParams(**kw)  # type: ignore[arg-type]
    return StopChecker(params, frozenset({99}), max_total_len=20, detokenize=_chars)


def _chars(ids: list[int]) -> str:
    return "".join(chr(ord("a") + i % 26) for i in ids)


def test_stop_conditions() -> None:
    assert _checker().check([5, 99], 1) == FINISH_STOP
    assert _checker(ignore_eos=True).check([5, 99], 1) is None
    assert _checker(stop_token_ids=(7,)).check([5, 7], 1) == FINISH_STOP
    assert _checker(max_tokens=2).check([5, 6, 7], 1) == FINISH_LENGTH
    assert _checker().check(list(range(20)), 1) == FINISH_LENGTH  # the context is full


def test_stop_string_completed_by_newest_token_only() -> None:
    checker = _checker(stop=("cd",))
    prompt = [0]
    assert checker.check([*prompt, 2], 1) is None  # "c"
    assert checker.check([*prompt, 2, 3], 1) == FINISH_STOP  # "cd"
    assert truncate_at_stop("abcdef", ("cd", "f")) == "ab"
    assert truncate_at_stop("abc", ("x",)) == "abc"


def _bytes(ids: list[int]) -> str:
    """A byte-level tokenizer's decoding: a character split over tokens is U+FFFD until whole."""
    return bytes(ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize("stop", ["é", "café", "😀", "a😀", "。"])
def test_a_stop_string_ending_in_a_character_split_over_tokens_is_found(stop: str) -> None:
    """Its last character's bytes come in several tokens: the stop was looked for from one
    character too late and never found (the request ran to max_tokens)."""
    output = list("x café 😀 a😀 。 y".encode())
    params = SamplingParams(stop=(stop,), max_tokens=100)
    checker = StopChecker(params, frozenset(), max_total_len=1000, detokenize=_bytes)
    prompt = list(b"p")
    ends = [n for n in range(1, len(output) + 1) if checker.check([*prompt, *output[:n]], 1)]
    text = bytes(output).decode()
    assert ends and _bytes(output[: ends[0]]) == text[: text.index(stop) + len(stop)]


def test_a_stop_string_longer_than_the_window_is_found() -> None:
    """A stop string of 40 one-character tokens: looked for in the last 32 tokens only, it was
    never found, and the request ran to max_tokens."""
    output = list(range(60))
    stop = _chars(output[10:50])
    params = SamplingParams(stop=(stop,), max_tokens=100)
    checker = StopChecker(params, frozenset(), max_total_len=1000, detokenize=_chars)
    prompt = [0]
    ends = [n for n in range(1, 61) if checker.check([*prompt, *output[:n]], 1) is not None]
    assert ends == [50]
    assert checker.window == 40 + STOP_WINDOW_SLACK


def test_stop_strings_are_bounded_and_valid_text() -> None:
    with pytest.raises(RequestError, match="at most 512 bytes"):
        SamplingParams(stop=("x" * 513,))
    with pytest.raises(RequestError, match="not valid Unicode text"):
        SamplingParams(stop=("\ud800",))
    SamplingParams(stop=("\u00e9" * 256,))  # 512 bytes


def test_expected_tokens() -> None:
    probs = accept_probs([0.5, 0.5, 0.5])
    assert probs == [0.5, 0.25, 0.125]
    assert expected_tokens(probs, 0) == 1.0
    assert expected_tokens(probs, 3) == 1.875


def test_acceptance_estimate_counts_reached_positions() -> None:
    est = AcceptanceEstimate(max_k=4, decay=1.0)
    est.update(4, 1)  # pos 0 accepted, pos 1 rejected, pos 2-3 never reached
    assert est.reached == [1.0, 1.0, 0.0, 0.0]
    assert est.accepted == [1.0, 0.0, 0.0, 0.0]


def test_a_position_seldom_reached_takes_its_shallower_neighbours_rate() -> None:
    """Position 0 reached 41 times (37 accepted), 1 37 times (35), 2 once, 3 never: each is
    shrunk towards the position before it, not a flat 0.6."""
    est = AcceptanceEstimate(max_k=4, decay=1.0)
    for accepted in [0] * 4 + [1] * 2 + [2] * 34:
        est.update(2, accepted)
    est.update(3, 3)
    assert est.reached == [41.0, 37.0, 1.0, 0.0]
    chained = est.chained_alphas(0.6, 1.0)
    assert chained[0] == pytest.approx((37 + 0.6) / 42)
    assert chained[1] == pytest.approx((35 + chained[0]) / 38)
    assert chained[2] == pytest.approx((1 + chained[1]) / 2)
    assert chained[3] == pytest.approx(chained[2])
    assert est.alphas([0.6] * 4, 1.0)[3] == pytest.approx(0.6)  # the flat prior's answer


def test_adaptive_drafts_past_its_habit_where_the_positions_it_sees_pay() -> None:
    """Narrow prose at 4 sequences on the CPU: every fixed k within 5%, deeper positions
    accepted ~0.97 of the time, and adaptive's rounds at k = 2 never reach position 3. With a
    flat 0.6 for positions it had not seen, it priced k = 6 below k = 2 and stayed at 2
    (0.965-0.974x the best fixed k, k = 6, in three runs); a position seen once or never now
    takes the rate of the position before it, and the choice goes deep where the costs allow.
    Costs: verify grows 1 ms a token from 4 ms, drafting free."""
    ctl = _costed(1e-9, {t: 0.003 + 0.001 * t for t in range(1, 8)}, batch=4)
    ests = [ctl.new_estimate() for _ in range(4)]
    for _ in range(30):
        for est in ests:
            ctl.observe(est, 2, 2)  # rounds at k = 2, both drafts accepted
    assert min(ctl._prior()[2:6]) > 0.9
    probs = [accept_probs(e.alphas(ctl._prior(), 8.0)) for e in ests]
    assert ctl._best_k(probs, [6] * 4) == 6


def test_fixed_mode_clips_to_limits() -> None:
    ctl = SpeculationController(ControllerConfig(max_k=8, adaptive=False, fixed_k=4))
    assert ctl.choose([ctl.new_estimate()] * 3, [8, 2, 0]) == [4, 2, 0]


def _costed(
    draft_step_s: float, verify_by_len: dict[int, float], batch: int
) -> SpeculationController:
    ctl = SpeculationController(ControllerConfig(max_k=8, adaptive=True))
    ctl.costs.record_draft(batch, 1, draft_step_s)
    for length, seconds in verify_by_len.items():  # measured often enough to be trusted
        for _ in range(MIN_COST_SAMPLES):
            ctl.costs.record_verify(batch, length, seconds)
    return ctl


def _trained(ctl: SpeculationController, alpha_hits: int, rounds: int = 50) -> AcceptanceEstimate:
    est = ctl.new_estimate()
    for _ in range(rounds):
        ctl.observe(est, 8, alpha_hits)
    return est


def test_adaptive_speculates_when_drafts_are_cheap_and_accepted() -> None:
    ctl = _costed(0.001, {1: 0.030, 9: 0.032}, batch=1)
    est = _trained(ctl, 8)  # everything accepted
    assert ctl.choose([est], [8]) == [8]


def test_adaptive_turns_speculation_off_when_it_does_not_pay() -> None:
    # Verify cost grows with length (compute bound) and drafts are rejected: plain decoding wins.
    ctl = _costed(0.004, {1: 0.010, 9: 0.090}, batch=32)
    ests = [_trained(ctl, 0) for _ in range(32)]
    assert ctl.choose(ests, [8] * 32) == [0] * 32


def _explorations(ctl: SpeculationController, ests: list[AcceptanceEstimate], rounds: int) -> int:
    """How many of `rounds` choices were exploratory (K = 1 from plain decoding)."""
    chosen = [ctl.choose(ests, [8] * len(ests)) for _ in range(rounds)]
    assert all(set(ks) <= {0, 1} for ks in chosen)
    return sum(1 for ks in chosen if ks[0] == 1)


def _plain_winning(
    draft_step_s: float, overhead_k1_s: float
) -> tuple[SpeculationController, list[AcceptanceEstimate]]:
    """Batch 16, a plain round 3.2 ms (verify 1.6, the rest 1.6); a K = 1 round's draft and
    rest as given, its verify 1.6; longer passes dear; every sequence's first draft accepted
    half the time."""
    ctl = _costed(draft_step_s, {1: 0.0016, 2: 0.0016, 9: 0.050}, batch=16)
    ctl.costs.record_overhead(16, 0, 0.0016)
    ctl.costs.record_overhead(16, 1, overhead_k1_s)
    ests = [ctl.new_estimate() for _ in range(16)]
    for i in range(40):
        for est in ests:
            ctl.observe(est, 1, i % 2)
    return ctl, ests


def _exploration_loss(ctl: SpeculationController, ests: list[AcceptanceEstimate]) -> float:
    """A K = 1 round's predicted cost beyond plain decoding's price of its expected tokens;
    plain decoding must be the choice."""
    assert ctl.choose(ests, [8] * 16) == [0] * 16
    costs = ctl.costs.round_costs(16, 1)
    assert costs is not None and ctl._last_choice is not None
    tokens = ctl._last_choice[0]
    assert 23.0 < tokens[1] < 25.0  # 16 sequences, each 1 + ~0.5
    return costs[1] - tokens[1] * costs[0] / 16


def test_exploration_is_rare_where_a_speculative_round_is_dear() -> None:
    """The H200's sampled rounds: K = 1 costs ~13 ms against 3.2 for plain. Exploring every
    16 rounds lost 25% of plain decoding's rate; the budget keeps the predicted loss within
    2% of the plain rounds' time."""
    ctl, ests = _plain_winning(0.005, 0.0066)
    loss = _exploration_loss(ctl, ests)
    assert loss > 0.008  # ~8.4 ms beyond what plain decoding pays for its tokens
    rounds = 2000
    explored = _explorations(ctl, ests, rounds)
    assert 1 <= explored <= 1 + rounds * 0.02 * 0.0032 / loss  # ~16, not 2000 / 17
    assert explored >= rounds * 0.02 * 0.0032 / loss - 1


def test_exploration_keeps_its_pace_where_a_speculative_round_is_cheap() -> None:
    """A K = 1 round that costs what plain decoding pays for its tokens (a CPU at a
    break-even, inside the 3% margin): one every 16 rounds, as before."""
    ctl, ests = _plain_winning(0.0008, 0.0024)
    assert abs(_exploration_loss(ctl, ests)) < 0.0005
    assert _explorations(ctl, ests, 16 * 20) == 20  # after one plain choice above


def test_cost_model_learns_a_catch_up_beyond_the_steady_drafting_price() -> None:
    """A drafting round after plain ones costs its steady price plus feeding the drafter what
    they committed: learned apart, per token behind, and before any steady round as a whole
    (the drafting step with it)."""
    costs = CostModel()
    assert costs.catch_up_line(32) == (0.0, 0.0)
    costs.record_catch_up(32, 1, 16, 0.022)  # no steady price yet: all of it
    assert costs.catch_up_line(32) == (0.0, 0.022 / 16)
    costs.record_draft(32, 1, 0.005)
    costs.catch_up_samples.clear()
    for behind in (4, 8, 16, 4, 8, 16):
        costs.record_catch_up(32, 1, behind, 0.005 + 0.002 + 0.001 * behind)
    intercept, per_token = costs.catch_up_line(32)
    assert abs(intercept - 0.002) < 1e-9 and abs(per_token - 0.001) < 1e-9
    # the nearest batch size's, its price per token behind scaled to the rows that feed
    assert costs.catch_up_line(16) == (intercept, per_token * 16 / 32)
    assert costs.draft_cost(32, 1) == 0.005  # the steady price is not moved by catch-ups


def test_a_catch_up_of_a_token_or_two_is_not_learned() -> None:
    """Feeding one token more costs about nothing (the first draft step feeds a chunk
    anyway): what such a round measures beyond the steady price is noise, and a line through
    it alone (1 token, 3 ms) priced a 150-token prompt at 450 ms where it cost 65."""
    costs = CostModel()
    costs.record_draft(16, 1, 0.0015)
    for behind in range(1, MIN_CATCH_UP_BEHIND):
        costs.record_catch_up(16, 1, behind, 0.0045)
    assert costs.catch_up_line(16) == (0.0, 0.0)
    costs.record_catch_up(16, 1, MIN_CATCH_UP_BEHIND, 0.0045)
    intercept, per_token = costs.catch_up_line(16)
    assert intercept == 0.0 and abs(per_token - 0.003 / MIN_CATCH_UP_BEHIND) < 1e-12


def test_the_first_drafting_round_prices_catch_ups_until_one_is_learned() -> None:
    """The engine's first drafting round is not learned (one-time costs), so a fresh engine
    whose only batch started drafting at once had no catch-up price, and the next batch's
    prompts were free to feed. That round's time per token fed stands in until a catch-up is
    learned (scaled by rows: feeding is a prefill), but not for the exploration interval: an
    exploratory round is what learns the real price."""
    costs = CostModel()
    costs.record_first_catch_up(16, MIN_CATCH_UP_BEHIND - 1, 0.5)  # fed nothing to speak of
    assert costs.first_catch_up is None
    costs.record_first_catch_up(16, 200, 0.032)
    costs.record_first_catch_up(16, 100, 5.0)  # only the engine's first counts
    assert costs.catch_up_line(16) == (0.0, 0.032 / 200)
    assert costs.catch_up_line(4) == (0.0, 0.032 / 200 / 4)
    assert costs.catch_up_line(16, learned_only=True) == (0.0, 0.0)
    costs.record_draft(16, 1, 0.002)
    for behind in (8, 16, 8, 16):
        costs.record_catch_up(16, 1, behind, 0.002 + 0.001 + 0.0001 * behind)
    intercept, per_token = costs.catch_up_line(16)
    assert abs(intercept - 0.001) < 1e-9 and abs(per_token - 0.0001) < 1e-9
    assert costs.catch_up_line(16, learned_only=True) == (intercept, per_token)


def test_a_batch_that_would_pay_its_prompts_to_gain_little_stays_plain() -> None:
    """The demo pair at 16 sequences of 64 tokens (CPU): a K = 1 round 5% ahead of plain
    decoding, and the drafter 218 tokens behind on every row (their prompts). Priced from
    the first drafting round (~27 ms to feed 16 prompts, 8 plain rounds), starting is not
    worth it for the 768 tokens left; with nothing learned or stood in, feeding was free."""
    ctl = _costed(0.0015, {1: 0.019, 2: 0.0347}, batch=16)
    ests = [_trained(ctl, 6) for _ in range(16)]  # position 1 always accepted

    def choice() -> list[int]:
        ctl._plain_batch = ctl._kept_batch = None
        return ctl.choose(ests, [1] * 16, behind=[218] * 16, left=[48] * 16)

    assert choice() == [1] * 16
    ctl.costs.record_first_catch_up(16, 218, 0.027)
    assert choice() == [0] * 16
    # a first round dearer by one-time costs (0.46 ms a token fed, where the budget of a
    # plain round's exploring is 0.38) does not put exploring off: exploring learns the price
    ctl.costs.first_catch_up = (16, 218, 0.1)
    assert choice() == [0] * 16
    assert ctl._explore_every == EXPLORE_EVERY


def _switching(left: int, behind: int) -> list[int]:
    """16 sequences whose drafts are mostly accepted and a K = 1 round 5% ahead of plain
    decoding, their drafter `behind` tokens (feeding costs 0.25 ms a token at 16 rows), with
    `left` tokens each to generate: what the controller chooses."""
    ctl = _costed(0.0015, {1: 0.019, 2: 0.0347}, batch=16)
    for tokens in (150, 260, 150, 260):  # prompts fed at their first drafts
        ctl.costs.record_catch_up(16, 1, tokens, 0.0015 + 0.002 + 0.00025 * tokens)
    ests = [_trained(ctl, 6) for _ in range(16)]  # position 1 always accepted
    return ctl.choose(ests, [1] * 16, behind=[behind] * 16, left=[left] * 16)


def test_starting_to_draft_pays_for_feeding_the_drafter_first() -> None:
    """A drafter that never drafted for a sequence (or not since many plain rounds) must
    take what it is behind before it drafts: at 16 sequences on the narrow bench target that
    was ~70 ms, 3.5 plain rounds, paid for a few rounds of drafting before the batch ended.
    That one-off price is spread over the tokens the batch has left: near the end it is
    not worth paying; with much left, or nothing to feed, the same rates speculate."""
    assert _switching(left=8, behind=200) == [0] * 16
    assert _switching(left=4000, behind=200) == [1] * 16
    assert _switching(left=8, behind=0) == [1] * 16


def test_exploration_is_rarer_where_it_pays_a_catch_up() -> None:
    """The wide bench target at 32 sequences on the CPU: a K = 1 round after 16 plain ones
    fed the drafter 16 tokens a row first (22 ms against 4.8 for a steady step) and lost
    ~64 ms where 34 were predicted. With the catch-up priced, the loss per exploration
    grows with the interval, and the interval grows until the budget covers it; where the
    catch-up alone costs more per plain round than the budget allows, exploring never pays
    for itself and happens at the longest interval."""
    ctl, ests = _plain_winning(0.0008, 0.0024)
    assert ctl.choose(ests, [8] * 16) == [0] * 16
    assert ctl._explore_every == 16  # a K = 1 round costs what plain decoding pays
    # 1 ms beyond the steady price, plus 0.02 ms per token behind (a plain round: 3.2 ms,
    # so the budget is 0.064 ms a plain round, 0.044 of it left past the feeding)
    for behind in (16, 32, 16, 32):
        ctl.costs.record_catch_up(16, 1, behind, 0.0008 + 0.001 + 0.00002 * behind)
    ctl._plain_batch = None
    assert ctl.choose(ests, [8] * 16) == [0] * 16
    loss = _exploration_loss(ctl, ests) + 0.001
    assert ctl._explore_every == max(16, math.ceil(loss / (0.02 * 0.0032 - 0.00002)))
    assert ctl._explore_every > 16
    ctl.costs.catch_up_samples.clear()
    for behind in (16, 32, 16, 32):  # feeding costs 0.08 ms a token: over the budget
        ctl.costs.record_catch_up(16, 1, behind, 0.0008 + 0.00008 * behind)
    ctl._plain_batch = None
    assert ctl.choose(ests, [8] * 16) == [0] * 16
    assert ctl._explore_every == MAX_EXPLORE_EVERY


@pytest.mark.parametrize("batch", [16, 1])
def test_exploring_keeps_its_pace_until_the_estimate_rests_on_enough_drafts(batch: int) -> None:
    """The wide bench target at 16 sequences of prose (CPU): the warm-up's first rounds, 42
    drafts, estimated position 1 at 0.71 where fixed k = 2 measured 0.90; plain decoding won
    at that, the catch-up priced exploring MAX_EXPLORE_EVERY rounds apart, and the estimate
    was never corrected. Until MIN_EXPLORE_EVIDENCE drafts (MIN_EXPLORE_ROUNDS rounds' worth
    at a small batch: at batch 1, 64 drafts would take 64 exploratory rounds), exploring
    keeps its pace."""
    ctl = _costed(0.0008, {1: 0.0016, 2: 0.0016, 9: 0.050}, batch=batch)
    ctl.costs.record_overhead(batch, 0, 0.0016)
    ctl.costs.record_overhead(batch, 1, 0.0024)
    for behind in (16, 32, 16, 32):  # feeding costs 0.08 ms a token: over the budget
        ctl.costs.record_catch_up(batch, 1, behind, 0.0008 + 0.00008 * behind)
    ests = [ctl.new_estimate() for _ in range(batch)]
    needed = min(MIN_EXPLORE_EVIDENCE, MIN_EXPLORE_ROUNDS * batch)
    rounds = 0
    while True:
        for est in ests:  # every sequence's first draft accepted half the time
            ctl.observe(est, 1, rounds % 2)
        rounds += 1
        ctl._plain_batch = None
        assert ctl.choose(ests, [8] * batch) == [0] * batch
        if ctl.global_estimate.reached[0] >= needed:
            break
        assert ctl._explore_every == EXPLORE_EVERY
    assert MIN_EXPLORE_ROUNDS <= rounds <= MIN_EXPLORE_ROUNDS + 1
    assert ctl._explore_every == MAX_EXPLORE_EVERY


def test_a_kept_plain_choice_follows_the_batch_and_its_observations() -> None:
    """Plain rounds of one batch keep the choice without recomputing it; a different batch,
    or drafts observed, make it again."""
    ctl, ests = _plain_winning(0.0008, 0.0024)
    assert ctl.choose(ests, [8] * 16) == [0] * 16
    assert ctl._plain_batch is not None  # kept for this batch
    keen = [_trained(ctl, 8) for _ in range(16)]  # every draft accepted: speculation pays
    assert min(ctl.choose(keen, [8] * 16)) >= 1  # another batch: chosen afresh
    assert ctl._plain_batch is None and ctl._rounds_without_spec == 0  # not an exploration
    ctl, ests = _plain_winning(0.0008, 0.0024)
    assert ctl.choose(ests, [8] * 16) == [0] * 16
    for est in ests:  # the same batch, whose drafts now all pass
        for _ in range(60):
            ctl.observe(est, 8, 8)
    assert ctl._plain_batch is None
    assert min(ctl.choose(ests, [8] * 16)) >= 1
    assert ctl._rounds_without_spec == 0


def test_a_kept_plain_choice_ends_where_plain_rounds_got_dear_enough_to_lose() -> None:
    """Plain rounds measured slower, past the price at which the best speculative length
    would have won: the choice is made again (at once, not at the next exploration)."""
    ctl, ests = _plain_winning(0.0008, 0.0024)
    assert ctl.choose(ests, [8] * 16) == [0] * 16
    assert ctl._plain_batch is not None and 0.0032 < ctl._plain_flip_cost < 0.004
    assert ctl.choose(ests, [8] * 16) == [0] * 16  # kept
    for _ in range(40):  # plain passes twice as slow
        ctl.costs.record_verify(16, 1, 0.0048)
    assert min(ctl.choose(ests, [8] * 16)) >= 1
    assert ctl._rounds_without_spec == 0  # chosen, not explored


def test_adaptive_explores_unmeasured_plain_decoding_first() -> None:
    ctl = SpeculationController(ControllerConfig(max_k=4, adaptive=True))
    est = ctl.new_estimate()
    assert ctl.choose([est], [4]) == [4]  # nothing measured: speculate and measure
    ctl.costs.record_verify(1, 5, 0.02)
    assert ctl.choose([est], [4]) == [0]  # then measure plain decoding once
    ctl.costs.record_verify(1, 1, 0.02)
    # A new batch size borrows batch 1's curve (T = 5 costs what T = 1 does): no plain round.
    assert ctl.choose([est] * 3, [4] * 3) == [4] * 3
    assert ctl.choose([est] * 8, [4] * 8) == [4] * 8


def test_a_new_batch_size_waits_for_nothing_once_plain_cost_has_a_shape() -> None:
    """Only plain decoding measured nowhere is measured first; a bucket measured at one
    speculative length borrows plain's share of the cost from a bucket measured at both."""
    ctl = SpeculationController(ControllerConfig(max_k=4, adaptive=True))
    est = _trained(ctl, 8)
    ctl.costs.record_verify(4, 5, 0.02)
    assert not ctl.costs.knows_plain_cost(16)
    assert ctl.choose([est] * 16, [4] * 16) == [0] * 16  # nothing to borrow: measure plain
    ctl.costs.record_verify(4, 1, 0.01)
    assert ctl.costs.knows_plain_cost(16)
    ctl.costs.record_verify(16, 5, 0.08)  # batch 16: one speculative length only
    assert abs((ctl.costs.verify_cost(16, 1) or 0) - 0.04) < 1e-12


def test_cost_model_interpolates_lengths() -> None:
    costs = CostModel()
    costs.record_verify(16, 1, 0.01)
    costs.record_verify(16, 5, 0.05)
    assert abs((costs.verify_cost(16, 3) or 0) - 0.03) < 1e-12
    assert abs((costs.verify_cost(16, 9) or 0) - 0.09) < 1e-12
    assert costs.verify_cost(9, 3) == costs.verify_cost(16, 3)  # unmeasured: the nearest's


def test_a_longer_pass_is_never_priced_below_a_shorter_one() -> None:
    """T = 3 measured in a faster spell than T = 1 and 2 (the narrow bench target at batch
    1): the three are priced at their mean weighted by samples, and no round drafting 2
    looks cheaper than a plain round; a rising table is left as measured."""
    costs = CostModel()
    for _ in range(4):
        costs.record_verify(1, 1, 0.0139)
        costs.record_verify(1, 3, 0.0118)
        costs.record_verify(1, 5, 0.0166)
    for _ in range(2):
        costs.record_verify(1, 2, 0.0137)
    pooled = (4 * 0.0139 + 2 * 0.0137 + 4 * 0.0118) / 10
    for length in (1, 2, 3):
        assert abs((costs.verify_cost(1, length) or 0.0) - pooled) < 1e-12
    assert costs.verify_cost(1, 5) == 0.0166
    assert abs((costs.verify_cost(1, 4) or 0.0) - (pooled + 0.0166) / 2) < 1e-12
    round_costs = costs.round_costs(1, 4) or []
    assert round_costs == sorted(round_costs)
    rising = CostModel()
    for length, seconds in ((1, 0.010), (2, 0.011), (4, 0.015)):
        rising.record_verify(1, length, seconds)
    assert [rising.verify_cost(1, t) for t in (1, 2, 4)] == [0.010, 0.011, 0.015]


def test_each_batch_size_keeps_its_own_costs() -> None:
    """A wave's tail (11 sequences, drafting long, cheaper passes) does not price the full
    batch's long passes; an unmeasured batch size takes the nearest measured one's costs."""
    costs = CostModel()
    for _ in range(4):
        costs.record_verify(16, 1, 0.006)
        costs.record_verify(16, 6, 0.025)
        costs.record_verify(11, 7, 0.012)
    assert costs.verify_cost(16, 6) == 0.025
    assert abs((costs.verify_cost(16, 7) or 0) - 0.0288) < 1e-12  # the line from 1 to 6
    assert costs.verify_cost(12, 7) == 0.012


def test_cost_model_borrows_curve_shape_for_new_batch_size() -> None:
    costs = CostModel()
    costs.record_verify(1, 1, 0.010)
    costs.record_verify(1, 5, 0.020)  # batch 1: T=5 costs 2x T=1
    costs.record_verify(32, 1, 0.050)  # batch 32 measured only for plain decoding
    assert abs((costs.verify_cost(32, 5) or 0) - 0.100) < 1e-12


def test_cost_model_fits_draft_intercept_and_resists_outliers() -> None:
    costs = CostModel()
    for k in (1, 2, 4, 1, 2, 4):
        costs.record_draft(1, k, 0.0004 + 0.0013 * k)  # every round pays 0.4 ms once
    assert abs(costs.draft_cost(1, 3) - (0.0004 + 0.0039)) < 1e-9
    for seconds in (0.005, 0.005, 0.005, 0.050):  # one slow pass
        costs.record_verify(1, 1, seconds)
    assert costs.verify_cost(1, 1) == 0.005
    costs.record_overhead(1, 0, 0.001)
    assert abs((costs.round_cost(1, 0) or 0) - 0.006) < 1e-12  # verify + overhead, no draft


def test_cost_model_follows_the_machines_speed_across_lengths() -> None:
    """T = 2 measured in a fast spell, then only T = 1 in a slow one (1.5x): T = 2 is priced
    at the slow spell's speed too, not at the fast spell's seconds. A steady machine keeps
    the speed at exactly 1, and a lone slow pass does not move it."""
    costs = CostModel()
    for _ in range(4):
        costs.record_verify(16, 1, 0.040)
        costs.record_verify(16, 2, 0.072)
    assert costs.speed == 1.0
    costs.record_verify(16, 1, 0.400)  # one pass 10x slower
    assert costs.speed == 1.0 and costs.verify_cost(16, 1) == 0.040
    for _ in range(12):
        costs.record_verify(16, 1, 0.060)
    assert abs(costs.speed - 1.5) < 1e-12
    assert abs((costs.verify_cost(16, 1) or 0) - 0.060) < 1e-12
    assert abs((costs.verify_cost(16, 2) or 0) - 0.108) < 1e-12  # 0.072 at the old speed
    for _ in range(5):  # back to the first speed: T = 1 alone brings T = 2 back with it
        costs.record_verify(16, 1, 0.040)
    assert abs((costs.verify_cost(16, 2) or 0) - 0.072) < 1e-12


def test_expected_tokens_by_k_sums_each_sequences_capped_expectation() -> None:
    from daemon.runtime.engine.controller import _expected_tokens_by_k

    rng = random.Random(3)
    probs = [sorted((rng.random() for _ in range(6)), reverse=True) for _ in range(5)]
    caps = [0, 1, 3, 6, 2]
    tokens = _expected_tokens_by_k(probs, caps, 6)
    for k in range(7):
        want = sum(expected_tokens(p, min(k, cap)) for p, cap in zip(probs, caps, strict=True))
        assert abs(tokens[k] - want) < 1e-12


def test_adaptive_does_not_draft_on_a_cost_measured_in_a_faster_spell() -> None:
    """Batch 16, a pass of 2 tokens costs 1.8x a pass of 1 (compute bound) and a draft is
    accepted 60% of the time: drafting one token emits 1.6 tokens for 1.8x the cost, so plain
    decoding pays. T = 2 was measured while the machine ran 1.5x faster than now; comparing
    its old seconds with T = 1's new ones (1.2x) made drafting look like 1.33x plain."""
    ctl = _costed(1e-9, {}, batch=16)
    for _ in range(4):
        ctl.costs.record_verify(16, 1, 0.040)
        ctl.costs.record_verify(16, 2, 0.072)
    for _ in range(12):
        ctl.costs.record_verify(16, 1, 0.060)
    probs = [[0.6, 0.0]] * 16
    assert ctl._best_k(probs, [1] * 16) == 0


def test_cost_model_fits_the_overhead_per_draft_robustly() -> None:
    costs = CostModel()
    for k in (0, 2, 4) * 6:
        costs.record_overhead(16, k, 0.0007 + 0.00015 * k)
    costs.record_overhead(16, 0, 0.010)  # one slow round (a collection)
    assert abs(costs.overhead_cost(16, 3) - 0.00115) < 1e-12
    assert abs(costs.overhead_cost(16, 0) - 0.0007) < 1e-12
    flat = CostModel()
    for _ in range(4):
        flat.record_overhead(16, 2, 0.001)
    assert flat.overhead_cost(16, 6) == 0.001  # one k seen: nothing to fit a slope to


def test_adaptive_charges_each_round_its_own_overhead() -> None:
    """Batch 16, a free draft, verify 10/16/20 ms at T = 1/2/3, and 1 ms outside the passes
    at k = 0 against 9 ms at k = 2 (rows to verify, tokens to commit). With 0.8 and 0.5
    per-position acceptance, plain decoding is best: 1 token / 11 ms, against 1.8 / 21 and
    2.2 / 29. Charging every round the median (5 ms) made k = 2 look best (2.2 / 25)."""
    ctl = _costed(1e-9, {1: 0.010, 2: 0.016, 3: 0.020}, batch=16)
    for _ in range(8):
        ctl.costs.record_overhead(16, 0, 0.001)
        ctl.costs.record_overhead(16, 2, 0.009)
    assert ctl._best_k([[0.8, 0.4]] * 16, [2] * 16) == 0


def test_adaptive_counts_fixed_overhead_in_favour_of_longer_rounds() -> None:
    """Per-position acceptance 0.8: without the 3 ms fixed cost per round k = 2 is best
    (2.44 tokens / 9 ms); with it, k = 3 amortises the overhead better (2.95 / 14 ms)."""
    ctl = _costed(0.0015, {1: 0.005, 2: 0.0055, 3: 0.006, 4: 0.0065, 5: 0.007}, batch=1)
    est = ctl.new_estimate()
    counts = [0] * 20 + [1] * 16 + [2] * 13 + [3] * 10 + [4] * 41  # geometric, 0.8
    random.Random(0).shuffle(counts)
    for accepted in counts * 3:
        ctl.observe(est, 4, accepted)
    without = ctl._best_k([accept_probs(est.alphas(ctl._prior(), 8.0))], [4])
    ctl.costs.record_overhead(1, 0, 0.003)
    with_overhead = ctl._best_k([accept_probs(est.alphas(ctl._prior(), 8.0))], [4])
    assert (without, with_overhead) == (2, 3)


def test_adaptive_does_not_speculate_for_a_gain_below_the_margin() -> None:
    """Where speculation is predicted to beat plain decoding by less than 3%, plain decoding
    (the break-even's prediction errors and probes cost more than that); past it, speculate.
    Batch 16, a free draft, verify 100 ms + 50 ms a token: k = 1 emits 1 + P(accept) tokens
    in 150 ms against plain's 1 in 100 ms."""
    ctl = _costed(1e-9, {1: 0.100, 2: 0.150, 3: 0.200}, batch=16)
    breakeven = [[0.52, 0.27, 0.14]] * 16  # k = 1: 1.52 / 0.15 = 1.013x plain
    paying = [[0.60, 0.36, 0.22]] * 16  # k = 1: 1.60 / 0.15 = 1.067x plain
    assert ctl._best_k(breakeven, [3] * 16) == 0
    assert ctl._best_k(paying, [3] * 16) == 1


def test_adaptive_probes_one_position_further_now_and_then() -> None:
    ctl = _costed(0.004, {1: 0.010, 2: 0.0105, 3: 0.011, 4: 0.03, 5: 0.04}, batch=1)
    est = _trained(ctl, 1)  # only the first draft is ever accepted: k = 1 is best
    ks = [ctl.choose([est], [4])[0] for _ in range(16)]
    assert ks.count(1) == 14 and ks.count(2) == 2


def test_adaptive_does_not_probe_a_position_that_could_not_pay() -> None:
    """The same, but a pass of 3 tokens costs 1.8x a pass of 2: k = 2 would lose to k = 1
    even were its second draft always accepted (3 tokens in 27 ms against 2 in 14.5), so
    nothing a probe there learns could change the choice, and none runs."""
    ctl = _costed(0.004, {1: 0.010, 2: 0.0105, 3: 0.019, 4: 0.03, 5: 0.04}, batch=1)
    est = _trained(ctl, 1)
    ks = [ctl.choose([est], [4])[0] for _ in range(64)]
    assert ks == [1] * 64


def test_two_rejections_do_not_talk_a_sequence_out_of_speculating() -> None:
    ctl = _costed(0.001, {1: 0.010, 5: 0.013}, batch=1)
    for _ in range(100):  # the engine-wide picture: drafts are mostly accepted
        ctl.observe(ctl.new_estimate(), 4, 4)
    est = ctl.new_estimate()
    ctl.observe(est, 4, 0)
    ctl.observe(est, 4, 0)
    assert ctl.choose([est], [4]) == [4]


def test_bad_request_leaves_engine_untouched(tmp_path) -> None:
    import pytest

    from daemon.runtime.engine.config import EngineConfig
    from daemon.runtime.engine.engine import SpecEngine
    from daemon.runtime.engine.request import Request
    from daemon.runtime.errors import RequestError
    from daemon.runtime.model import load_model
    from tests.tiny_models import make_tiny_checkpoint

    target = load_model(make_tiny_checkpoint(tmp_path / "t", with_tokenizer=False), num_slots=2)
    engine = SpecEngine(target, None, EngineConfig(max_batch_size=2))
    good = Request("a", [1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
    with pytest.raises(RequestError, match="outside the vocabulary"):
        engine.generate([good, Request("b", [1, 99999])])
    with pytest.raises(RequestError, match="prompt has 600 tokens"):
        engine.add_request(Request("c", [1] * 600))
    with pytest.raises(RequestError, match="empty"):
        engine.add_request(Request("d", []))
    assert not engine.has_unfinished()
    assert [len(o.token_ids) for o in engine.generate([good])] == [2]


def test_group_by_length_bounds_padded_tokens() -> None:
    from daemon.runtime.model.batch import group_by_length

    lengths = [5, 100, 3, 40, 200]
    groups = group_by_length(lengths, max_padded_tokens=120)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert groups == [[2, 0, 3], [1], [4]]  # 3 x 40 = 120 fits; 200 goes alone
    for group in groups[:-1]:
        assert len(group) * max(lengths[i] for i in group) <= 120


def test_scheduler_packs_slots_low_and_keeps_the_batch_in_slot_order() -> None:
    """A freed slot is the next one taken (lowest first) and the batch stays sorted by slot,
    so a full batch's slots are one span of the KV cache (forward_metadata.slot_span)."""
    from daemon.runtime.engine.request import Request
    from daemon.runtime.engine.scheduler import Scheduler
    from daemon.runtime.engine.sequence import Sequence

    def start(scheduler: Scheduler) -> Sequence:
        request, slot = scheduler.admit()
        seq = Sequence(request, slot, _checker(), AcceptanceEstimate(4))
        scheduler.start(seq)
        return seq

    scheduler = Scheduler(num_slots=4)
    for i in range(6):
        scheduler.add(Request(f"r{i}", [1]))
    seqs = [start(scheduler) for _ in range(4)]
    assert [s.slot for s in seqs] == [0, 1, 2, 3] and not scheduler.can_admit()
    seqs[2].finish_reason = seqs[0].finish_reason = FINISH_STOP
    assert {s.slot for s in scheduler.retire_finished()} == {0, 2}
    assert [start(scheduler).slot for _ in range(2)] == [0, 2]
    assert [s.slot for s in scheduler.running] == [0, 1, 2, 3]
    offset = Scheduler(num_slots=2, first_slot=6)  # an engine beside others on one model
    for i in range(3):
        offset.add(Request(f"o{i}", [1]))
    assert [start(offset).slot for _ in range(2)] == [6, 7] and not offset.can_admit()
    offset.free_all()
    assert sorted(offset.free_slots) == [6, 7]


def test_adaptive_measures_the_verify_lengths_its_choices_skip() -> None:
    """A pass of 2 tokens costs what 1 does, 3 and more cost 1.6x and up (a step, as a CPU
    pass has). Having measured only T = 1 and T = 4, a line between them prices T = 2 at 1.23x
    and the controller keeps k = 3; its cost probes measure T = 2 and it settles on k = 1."""
    true_verify = {1: 0.010, 2: 0.0101, 3: 0.016, 4: 0.017, 5: 0.018, 6: 0.019}
    ctl = SpeculationController(ControllerConfig(max_k=5, adaptive=True))
    est = ctl.new_estimate()
    counts = [0] * 25 + [1] * 19 + [2] * 14 + [3] * 10 + [4] * 32  # geometric, 0.75
    random.Random(1).shuffle(counts)
    for accepted in counts * 3:
        ctl.observe(est, 4, accepted)
    for _ in range(3):
        ctl.costs.record_draft(1, 3, 0.0015)
        ctl.costs.record_verify(1, 1, true_verify[1])
        ctl.costs.record_verify(1, 4, true_verify[4])
    assert ctl.choose([est], [5]) == [3]
    chosen = []
    for _ in range(200):
        (k,) = ctl.choose([est], [5])
        ctl.costs.record_verify(1, k + 1, true_verify[k + 1])
        chosen.append(k)
    assert ctl.costs.verify_count(1, 2) >= 3
    # the rest: an out-of-date length measured again, at most once every STALE_PASSES passes
    # (a probe one position deeper could not win: a pass of 3 costs 1.6x a pass of 2)
    assert chosen[-48:].count(1) >= 46


def test_adaptive_at_its_ceiling_still_measures_shorter_lengths() -> None:
    """Drafting the ceiling leaves no deeper position to probe; the cost probes still run, or
    a controller that started deep would never learn that a shorter round is cheaper (here
    k = 3 would win if a pass of 4 cost what a pass of 1 does)."""
    ctl = _costed(0.0005, {1: 0.010, 5: 0.016}, batch=1)
    est = _trained(ctl, 8)  # everything accepted: the ceiling, 4, is best
    ks = [ctl.choose([est], [4])[0] for _ in range(16)]
    assert ks.count(4) == 14 and sorted(set(ks)) == [3, 4]


def test_pack_records_lays_out_point_masses_and_ragged_sparse_draws() -> None:
    from daemon.runtime.proposers.drafts import DraftRecord, SparseDraw, pack_records
    from daemon.runtime.sampling.quantized import PROPOSAL_TOTAL

    a, b, c = DraftRecord(), DraftRecord(), DraftRecord()
    a.append(5, SparseDraw(torch.tensor([5, 9, 2]), torch.tensor([1000, 24000, 7000]), 768), [5])
    a.append(7, None, [7])  # a point mass
    a.append(3, SparseDraw(torch.tensor([3]), torch.tensor([PROPOSAL_TOTAL]), 0), [3])
    b.append(11, None, [11])
    # c drafts nothing
    proposals = pack_records([a, b, c])
    assert proposals.draft_token_ids.tolist() == [[5, 7, 3], [11, -1, -1], [-1, -1, -1]]
    assert proposals.num_draft_tokens == [3, 1, 0]
    assert proposals.sparse_ids is not None and proposals.sparse_probs is not None
    assert proposals.sparse_tail is not None
    assert proposals.sparse_ids.shape == (3, 3, 3)
    assert proposals.sparse_ids[0].tolist() == [[5, 9, 2], [0, 0, 0], [3, 0, 0]]
    total = float(PROPOSAL_TOTAL)
    assert proposals.sparse_probs[0].tolist() == [
        [1000 / total, 24000 / total, 7000 / total],
        [0.0, 0.0, 0.0],
        [1.0, 0.0, 0.0],
    ]
    assert proposals.sparse_tail.tolist() == [[768 / total, 0.0, 0.0], [0.0] * 3, [0.0] * 3]
    assert not proposals.sparse_probs[1:].any() and not proposals.sparse_ids[1:].any()
    assert pack_records([b]).sparse_ids is None  # point masses only: no sparse tensors


def test_padded_rows_is_pad_sequence() -> None:
    """pack_records' padding: rows of one length stacked, of several padded with 0, as
    pad_sequence lays them out (rows of a length in their own order among the others)."""
    from torch.nn.utils.rnn import pad_sequence

    from daemon.runtime.proposers.drafts import _padded_rows

    gen = torch.Generator().manual_seed(3)
    for lengths in ([4, 4, 4], [3, 1, 3, 2, 1, 5], [1], [7, 2]):
        rows = [torch.randint(1, 100, (n,), generator=gen) for n in lengths]
        assert torch.equal(_padded_rows(rows), pad_sequence(rows, batch_first=True))


def test_pack_records_the_same_with_and_without_the_native_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The C layout of a round's draws (lists of several lengths from rows of one step's
    tensors, point masses, records of different lengths) equals the torch one."""
    from daemon.runtime.model import native
    from daemon.runtime.proposers.drafts import DraftRecord, SparseDraw, pack_records

    gen = torch.Generator().manual_seed(5)
    records = [DraftRecord() for _ in range(6)]
    for step, width in enumerate((3, 7, 1, 7)):
        ids = torch.randint(0, 500, (6, width), generator=gen)
        counts = torch.randint(0, 900, (6, width), generator=gen)
        for r, record in enumerate(records[: 6 - step]):  # later steps: fewer rows draft
            sparse = None if (r + step) % 5 == 0 else SparseDraw(ids[r], counts[r], 100 * r)
            record.append(int(ids[r, 0]), sparse, [int(ids[r, 0])])
    packed = {}
    for native_on in ("1", "0"):
        monkeypatch.setenv(native.DISABLE_ENV, native_on)
        packed[native_on] = pack_records(records)
    on, off = packed["1"], packed["0"]
    assert on.sparse_ids is not None and off.sparse_ids is not None
    for a, b in (
        (on.sparse_ids, off.sparse_ids),
        (on.sparse_probs, off.sparse_probs),
        (on.sparse_tail, off.sparse_tail),
        (on.draft_token_ids, off.draft_token_ids),
    ):
        assert a is not None and b is not None and a.dtype == b.dtype
        assert torch.equal(a, b)
    assert on.sparse_ids.shape == (6, 4, 7)


def test_adaptive_does_not_probe_lengths_that_could_not_pay() -> None:
    """Batch 16, drafting 3 ms a step, passes of 1-3 tokens 10 ms each, acceptance falling
    fast (0.9, then 0.5, then 0.1): k = 2 is best (2.35 tokens / 16 ms). k = 3 could not beat
    it even if a pass of 4 cost what a pass of 3 does (2.4 / 19 ms), so no cost probe measures
    it, nor anything longer; the old rule measured every length up to the ceiling."""
    ctl = _costed(0.003, {1: 0.010, 2: 0.010, 3: 0.010}, batch=16)
    for _ in range(3):
        ctl.costs.record_verify(16, 2, 0.010)
        ctl.costs.record_verify(16, 3, 0.010)
    probs = [[0.9, 0.45, 0.045, 0.0045, 0.00045, 0.00005]] * 16
    best = ctl._best_k(probs, [6] * 16)
    assert best == 2
    assert ctl._cost_probe_length(best, 16, 6) is None
    # Passes of 1, 3 and 5 tokens measured at 10, 10 and 30 ms, drafting free, acceptance
    # high: k = 2 is best (2.7 / 10 ms), and a pass of 4 priced on the line (20 ms) makes
    # k = 3 worse, but at 10 ms it would win (3.4 / 10): that length is measured. A pass of 2
    # (k = 1: 1.9 / 10 at best) and of 6 (k = 5: 4.5 / 30 at best) are not.
    flat = _costed(1e-6, {}, batch=16)
    for _ in range(3):
        for length, seconds in ((1, 0.010), (3, 0.010), (5, 0.030)):
            flat.costs.record_verify(16, length, seconds)
    high = [[0.9, 0.8, 0.7, 0.6, 0.5, 0.4]] * 16
    assert flat._best_k(high, [6] * 16) == 2
    assert flat._cost_probe_length(2, 16, 6) == 3
    assert flat.could_win(16, 6) == {3}


def test_the_draft_line_keeps_each_k_it_measured() -> None:
    """Drafting costs 0.14 ms + 0.14 ms a step (the demo pair at batch 1 on a CPU). The
    controller drafted 2 for a while, then settled on 4 and 5, a few of whose rounds were
    slow. A line through the latest 32 rounds alone took its slope from k = 4 and 5 and
    those slow rounds (about 0.8 ms + 0.02 a step) and priced k = 2 at twice its cost; a line
    through each k's median keeps k = 2's rounds, and the slow ones do not move it."""

    def cost(k: int) -> float:
        return 0.00014 + 0.00014 * k

    costs = CostModel()
    for _ in range(8):
        costs.record_draft(1, 2, cost(2))
    for i in range(16):
        costs.record_draft(1, 4, 0.0014 if i in (13, 14, 15) else cost(4))
        costs.record_draft(1, 5, cost(5))
    assert abs(costs.draft_cost(1, 2) - cost(2)) < 0.05 * cost(2)
    assert abs(costs.draft_cost(1, 5) - cost(5)) < 0.05 * cost(5)
    assert costs.draft_count(1) == 24  # 8 rounds per k
    for _ in range(DRAFT_MAX_AGE):  # k = 2's rounds grow too old: the line is k = 4 and 5's
        costs.record_draft(1, 4, cost(4) + 0.0001)
        costs.record_draft(1, 5, cost(5) + 0.0001)
    assert abs(costs.draft_cost(1, 4) - cost(4) - 0.0001) < 1e-9


def test_a_length_measured_once_and_slow_is_measured_again() -> None:
    """Batch 1, drafting 0.13 ms a step, the first 4 positions always accepted: k = 4 is best
    (5 tokens / 7.8 ms against k = 3's 4 / 7.4). Passes of 1-4 tokens were measured three
    times at their true cost, one of 5 once and slow (12 ms): k = 3 wins on that price, and
    that one pass was k = 4's floor too, so no probe ever measured it again (k = 3 for good).
    A length is its own floor only once measured MIN_COST_SAMPLES times: below that it could
    cost what a pass of 4 does, so it is probed, and k = 4 wins at its true price."""

    def truth(length: int) -> float:
        return 0.006 + 0.00033 * (length - 1)

    ctl = _costed(0.00013, {}, batch=1)
    for length in range(1, 6):
        for _ in range(1 if length == 5 else 3):
            ctl.costs.record_verify(1, length, 0.012 if length == 5 else truth(length))
    est = _trained(ctl, 4)
    chosen = []
    for _ in range(64):
        (k,) = ctl.choose([est], [8])
        ctl.costs.record_verify(1, k + 1, truth(k + 1))
        chosen.append(k)
    assert chosen[0] == 3  # on the slow pass's price
    assert 4 in chosen[: PROBE_EVERY * 2]  # a probe measures it again
    assert chosen[-32:].count(4) >= 28  # and k = 4 wins, but for probes


def _one_slow_pass(plain_passes: int) -> tuple[SpeculationController, AcceptanceEstimate]:
    """Batch 1 (the demo pair on the CPU): drafting 0.12 ms a step, every draft accepted,
    `plain_passes` plain passes measured at 0.55 ms and one pass of 5 tokens at 4.4 ms (a
    slow moment)."""
    ctl = _costed(0.00012, {}, batch=1)
    ctl.costs.record_verify(1, 5, 0.0044)
    for _ in range(plain_passes):
        ctl.costs.record_verify(1, 1, 0.00055)
    return ctl, _trained(ctl, 8)


def _priced_out_by_one_pass(five_tokens_s: list[float]) -> tuple[list[int], list[int]]:
    """_one_slow_pass with plain decoding trusted, the next passes of 5 tokens taking
    `five_tokens_s`: the choices of the first rounds, and of 40 rounds after them."""
    ctl, est = _one_slow_pass(MIN_COST_SAMPLES)
    first = []
    for seconds in five_tokens_s:
        (k,) = ctl.choose([est], [4])
        first.append(k)
        if k:
            ctl.costs.record_verify(1, k + 1, seconds)
            ctl.observe(est, k, k)
        else:
            ctl.costs.record_verify(1, 1, 0.00055)
    later = []
    for _ in range(40):
        (k,) = ctl.choose([est], [4])
        later.append(k)
        ctl.costs.record_verify(1, k + 1, 0.00055 if k == 0 else five_tokens_s[-1])
    return first, later


def test_plain_decoding_chosen_on_one_slow_pass_is_checked_again() -> None:
    """Priced from one slow pass, drafting 4 costs 8x a plain round and plain decoding wins;
    from plain decoding nothing measured a length again but exploratory rounds at K = 1,
    which a catch-up's price put MAX_EXPLORE_EVERY rounds apart (adaptive decoded plain for
    a whole bench, 0.98x target-only where k = 4 made 1.29x). Such a length is measured again
    (its price is kept between rounds no longer than its first passes: cost_model.py), and
    wins at its true price."""
    first, later = _priced_out_by_one_pass([0.0006, 0.0006])
    assert first == [4, 4]  # rechecks, not plain decoding
    assert later.count(4) == len(later)


def test_a_recheck_waits_for_plain_decodings_price_not_for_an_exploration() -> None:
    """A recheck needs plain decoding's price trusted (MIN_COST_SAMPLES passes); a plain
    choice made before that is not kept (it would be until the next exploratory round, 16
    rounds on), so the recheck comes as soon as plain rounds have measured it."""
    ctl, est = _one_slow_pass(1)
    chosen = []
    for _ in range(8):
        (k,) = ctl.choose([est], [4])
        chosen.append(k)
        ctl.costs.record_verify(1, k + 1, 0.00055 if k == 0 else 0.0006)
        ctl.observe(est, k, k)
    assert chosen[:2] == [0, 0] and 4 in chosen[2:4]


def test_a_recheck_is_priced_from_the_trusted_lengths_not_its_floor() -> None:
    """16 sequences, every draft accepted; plain passes 2.4 ms and passes of 5 tokens 7.7,
    trusted; passes of 4 measured twice at 6.4; feeding the drafter the rows' prompts first
    costs 50 us per token the batch has left. Plain decoding wins, and the length measured
    twice is not rechecked: priced from the trusted lengths it still loses, where at its
    floor (a pass of 1 token's price) it would have won, and the recheck would have paid
    the prompts' feeding for nothing (27 ms at 16 sequences on the CPU)."""
    ctl = _costed(0.0004, {1: 0.0024, 5: 0.0077}, batch=16)
    for _ in range(2):
        ctl.costs.record_verify(16, 4, 0.0064)
    ctl.costs.record_first_catch_up(16, 200, 0.04)
    ests = [_trained(ctl, 8) for _ in range(16)]
    assert ctl.choose(ests, [4] * 16, behind=[200] * 16, left=[50] * 16) == [0] * 16


def test_a_recheck_whose_round_drafted_less_is_not_made_again() -> None:
    """A recheck asks for k drafts, but a proposer may draft fewer (an n-gram's miss, a
    drafter out of room): its length then gets no sample. Made again while its count stays
    the same, it was made every round, and plain decoding never explored."""
    ctl, est = _one_slow_pass(MIN_COST_SAMPLES)
    chosen = []
    for _ in range(20):
        (k,) = ctl.choose([est], [4])
        chosen.append(k)
        ctl.costs.record_verify(1, 1, 0.00055)  # nothing drafted: a plain pass
    assert chosen.count(4) == 1


def test_a_recheck_borrows_the_curve_of_a_batch_size_that_has_one() -> None:
    """At 16 sequences (every draft accepted) only plain decoding is trusted (2.4 ms), and a
    pass of 8 tokens was measured once, at 17 ms. Alone, that price could be true (it is
    below 8 plain passes), so it is not rechecked; where 8 sequences' trusted curve says a
    pass of 8 costs 1.3x one (weight-bound), it is; where it says 6.9x, not."""

    def choice(ratio_at_8: float | None) -> list[int]:
        ctl = _costed(0.0004, {1: 0.0024}, batch=16)
        ctl.costs.record_verify(16, 8, 0.017)
        if ratio_at_8 is not None:
            for length in range(1, 9):
                for _ in range(MIN_COST_SAMPLES):
                    seconds = 0.0012 * (1.0 + (length - 1) * (ratio_at_8 - 1.0) / 7)
                    ctl.costs.record_verify(8, length, seconds)
        ests = [_trained(ctl, 8) for _ in range(16)]
        return ctl.choose(ests, [7] * 16)

    assert choice(None) == [0] * 16
    assert choice(1.3) == [7] * 16
    assert choice(6.9) == [0] * 16


def test_a_length_slow_at_every_recheck_is_left_alone() -> None:
    """Where the slow pass was the truth, the rechecks confirm it: plain decoding, for good
    (each length is rechecked at most MIN_COST_SAMPLES - 1 times)."""
    first, later = _priced_out_by_one_pass([0.0044, 0.0044, 0.0044])
    assert first == [4, 4, 0]
    assert later.count(0) >= len(later) - 3  # the K = 1 explorations aside


def test_a_lengths_first_passes_move_its_kept_price() -> None:
    """The controller keeps round prices for a few rounds' records (_round_costs), until a new
    shape: a length's first passes are one (each moves its median a lot), later ones not."""
    costs = CostModel()
    before = costs.new_shape_records
    for i in range(SETTLING_SAMPLES + 2):
        costs.record_verify(2, 3, 0.001)
        added = costs.new_shape_records - before
        assert added == min(i + 1, SETTLING_SAMPLES)


def test_a_dearer_re_measure_is_trusted_only_once_confirmed() -> None:
    """A length's pass measured again after STALE_PASSES replaces its older samples. Where it
    came out no dearer than they said (within REMEASURED_SLACK) it is its own floor at once;
    dearer, only once MIN_COST_SAMPLES passes confirm it (a price too high is the error that
    sticks: the length is never chosen, so never measured again)."""
    costs = CostModel()
    for length in (1, 2, 3):
        for _ in range(MIN_COST_SAMPLES):
            costs.record_verify(1, length, 0.010)
    assert costs.is_trusted(1, 2, MIN_COST_SAMPLES)
    for _ in range(STALE_PASSES + 1):
        costs.record_verify(1, 1, 0.010)
    costs.record_verify(1, 2, 0.0105)  # 5% dearer: taken
    costs.record_verify(1, 3, 0.014)  # 40% dearer: its floor is T = 2's until confirmed
    assert costs.verify_count(1, 3) == 1
    assert costs.is_trusted(1, 2, MIN_COST_SAMPLES)
    assert not costs.is_trusted(1, 3, MIN_COST_SAMPLES)
    floors = costs.round_cost_floors(1, 2, MIN_COST_SAMPLES)
    assert floors[2] == floors[1]  # T = 3 floored at T = 2's price (nothing else to pay here)
    costs.record_verify(1, 3, 0.014)
    costs.record_verify(1, 3, 0.014)
    assert costs.is_trusted(1, 3, MIN_COST_SAMPLES)
    assert costs.round_cost_floors(1, 2, MIN_COST_SAMPLES)[2] == costs.round_costs(1, 2)[2]


def test_plain_decoding_measured_again_and_slow_once_is_confirmed() -> None:
    """Batch 16, drafts accepted at positions 1-2, a pass of T tokens 30 + 25 (T - 1) ms but
    a plain one 20 ms: plain decoding wins (16 tokens / 20 ms against k = 2's 48 / 82). Its
    price went out of date while others were measured, and the pass that measured it again
    was slow (45 ms): k = 2 wins on that price, and plain decoding could not beat k = 2 even
    30% cheaper (STALE_SLACK), so the out-of-date rule never measured it again. A re-measure
    that came out dearer is confirmed before it is believed: plain is measured again, and
    wins."""

    def truth(length: int) -> float:
        return 0.020 if length == 1 else 0.030 + 0.025 * (length - 1)

    ctl = _costed(0.001, {length: truth(length) for length in range(1, 10)}, batch=16)
    for _ in range(STALE_PASSES + 1):
        ctl.costs.record_verify(16, 3, truth(3))
    ctl.costs.record_verify(16, 1, 0.045)  # out of date, measured again: one slow pass
    ests = [_trained(ctl, 2) for _ in range(16)]
    chosen = []
    for _ in range(64):
        k = max(ctl.choose(ests, [8] * 16))
        ctl.costs.record_verify(16, k + 1, truth(k + 1))
        chosen.append(k)
    assert chosen[0] == 2  # on the slow pass's price
    assert 0 in chosen[: PROBE_EVERY * 2]  # a probe measures plain decoding again
    assert chosen[-32:].count(0) >= 30  # and it wins, but for explorations at k = 1


def _drifted_run(plain_now: float, rounds: int = 120) -> list[int]:
    """Batch 16, drafts accepted at positions 1-2 and never at 3 (k = 2 is the best length),
    every verify length measured three times while a pass of T tokens cost
    30 + 25 (T - 1) ms: k = 2 makes 48 tokens in 82 ms, 10% more than plain decoding's 16 in
    30. Then the machine changes: a plain pass costs `plain_now`, the rest what it did. The
    k chosen in each of `rounds` rounds."""
    ctl = _costed(0.001, {}, batch=16)

    def cost(length: int) -> float:
        return 0.030 + 0.025 * (length - 1)

    for _ in range(3):
        for length in range(1, 10):
            ctl.costs.record_verify(16, length, cost(length))
    ests = [_trained(ctl, 2) for _ in range(16)]
    chosen = []
    for _ in range(rounds):
        k = max(ctl.choose(ests, [8] * 16))
        ctl.costs.record_verify(16, k + 1, plain_now if k == 0 else cost(k + 1))
        chosen.append(k)
    return chosen


def test_adaptive_measures_plain_decoding_again_once_its_cost_is_out_of_date() -> None:
    """A plain pass that got cheaper (30 -> 20 ms: plain now beats k = 2 by 37%) is only seen
    if plain decoding is measured again. Once lengths are STALE_PASSES passes old, the ones
    that would win were they STALE_SLACK cheaper are probed, one every STALE_PASSES passes at
    most, nearest to winning first: k = 1 (32 tokens in 55 ms against k = 2's 48 in 80), then
    plain decoding (16 in 30), whose time replaces its old samples, and plain decoding wins
    from then on (but for its exploratory rounds). Without the probes, k = 2 forever."""
    chosen = _drifted_run(plain_now=0.020, rounds=160)
    assert chosen[:32].count(2) == 28  # before: k = 2, and every 8th round a probe at k = 3
    first = chosen.index(1)  # the first out-of-date probe: k = 1, the nearest to winning
    assert STALE_PASSES < first <= STALE_PASSES + 2 * PROBE_EVERY and 0 not in chosen[:first]
    second = chosen.index(0)  # then plain decoding, a round of the candidates later
    assert first + STALE_PASSES < second <= first + STALE_PASSES + 2 * PROBE_EVERY
    assert chosen[second:].count(0) >= len(chosen[second:]) - 4  # plain, but explorations


def test_adaptive_keeps_speculating_where_a_fresh_plain_pass_costs_the_same() -> None:
    """The same, but plain passes still cost 30 ms: the probes measure that, and k = 2 stays.
    Every out-of-date candidate is probed once before one is probed again (else the nearest
    to winning, out of date again by the next probe, would be the only one ever measured)."""
    chosen = _drifted_run(plain_now=0.030, rounds=160)
    assert chosen[-40:].count(2) >= 34 and chosen[-40:].count(0) <= 1
    # one out-of-date length measured again every STALE_PASSES passes at most: k = 1, plain,
    # then k = 1 again
    stale_probes = [(i, k) for i, k in enumerate(chosen) if k in (0, 1)]
    assert [k for _, k in stale_probes] == [1, 0, 1]
    assert all(b - a > STALE_PASSES for (a, _), (b, _) in itertools.pairwise(stale_probes))


def _stale_three_token_run(three_tokens_ms: float, rounds: int = 160) -> str:
    """Batch 4, per-position acceptance ~0.8, drafting 0.25 ms a step, a pass of T = 1..7
    tokens 4.0, 4.6, 5.0, 6.6, 7.6, 9.5, 11 ms: k = 2 is the best length (2.44 tokens a row
    in 5.5 ms, k = 3 2.95 in 7.35). Every length was measured MIN_COST_SAMPLES times at once,
    the 3-token pass at `three_tokens_ms` (a slow spell's); then each round pays the true
    price. The k chosen in each of `rounds` rounds, as digits."""
    truth = {1: 4.0, 2: 4.6, 3: 5.0, 4: 6.6, 5: 7.6, 6: 9.5, 7: 11.0}
    ctl = SpeculationController(ControllerConfig(max_k=6, adaptive=True))
    rng = random.Random(0)
    ests = [ctl.new_estimate() for _ in range(4)]
    for i in range(200):
        accepted = 0
        while accepted < 6 and rng.random() < 0.8:
            accepted += 1
        ctl.observe(ests[i % 4], 6, accepted)
    for k in range(1, 7):
        for _ in range(2):
            ctl.costs.record_draft(4, k, 0.00025 * k)
    for _ in range(MIN_COST_SAMPLES):
        for length, ms in truth.items():
            ctl.costs.record_verify(4, length, (three_tokens_ms if length == 3 else ms) / 1e3)
    chosen = []
    for _ in range(rounds):
        k = max(ctl.choose(ests, [6] * 4))
        ctl.costs.record_verify(4, k + 1, truth[k + 1] / 1e3)
        if k:
            ctl.costs.record_draft(4, k, 0.00025 * k)
        chosen.append(str(k))
    return "".join(chosen)


def test_an_out_of_date_length_nearest_to_winning_is_measured_again_first() -> None:
    """The 3-token pass priced 20% dear (6.0 ms where it costs 5.0): k = 3 wins on that price.
    k = 1 and k = 2 would both win were they cheaper; k = 2 is nearer to winning (2.44 / 6.5
    against 1.8 / 4.85, k = 3's 2.95 / 7.35), so the first out-of-date probe measures it, and
    k = 2 wins from there. Oldest first, k = 1 went first (k = 2 waited another STALE_PASSES
    passes, half this run). Priced 32% dear (6.6 ms), k = 2 could not win even 15% cheaper:
    with STALE_SLACK at 15% it was never measured again; now it is, after k = 1."""
    run = _stale_three_token_run(6.0)
    assert run[:32].count("3") >= 28  # on the slow spell's price
    first = run.index("2")
    assert STALE_PASSES < first <= STALE_PASSES + 2 * PROBE_EVERY and "1" not in run[:first]
    assert run[first:].count("2") >= len(run[first:]) - 8  # then k = 2, but for probes
    run = _stale_three_token_run(6.6)
    assert "2" in run and run[-16:].count("2") >= 14


def test_a_far_better_speculation_never_probes_plain_decoding() -> None:
    """At batch 1, drafting free and everything accepted, speculation makes 9 tokens where
    plain decoding makes 1 for about the same pass: plain could not win even 30% cheaper, so
    it is never measured again however old its price."""
    ctl = _costed(0.0001, {1: 0.030, 9: 0.032}, batch=1)
    est = _trained(ctl, 8)
    for _ in range(3):
        ctl.costs.record_verify(1, 1, 0.030)
    chosen = []
    for _ in range(200):
        (k,) = ctl.choose([est], [8])
        ctl.costs.record_verify(1, k + 1, 0.030 + 0.00025 * k)
        chosen.append(k)
    assert ctl.costs.passes_since(1, 1) == 200 and 0 not in chosen


def test_a_length_measured_again_after_stale_passes_drops_its_older_samples() -> None:
    costs = CostModel()
    for _ in range(5):
        costs.record_verify(4, 2, 0.050)
    assert costs.passes_since(4, 2) == 0 and costs.passes_since(4, 3) is None
    for _ in range(STALE_PASSES):
        costs.record_verify(4, 1, 0.010)
    assert costs.passes_since(4, 2) == STALE_PASSES
    costs.record_verify(4, 2, 0.020)  # just within: kept beside the old ones
    assert costs.verify_count(4, 2) == 6
    for _ in range(STALE_PASSES + 1):
        costs.record_verify(4, 1, 0.010)
    costs.record_verify(4, 2, 0.030)  # one pass too old: this spell's pass alone
    assert costs.verify_count(4, 2) == 1 and costs.verify_cost(4, 2) == 0.030
    assert costs.passes_since(9, 1) is None  # another batch size counts its own passes
