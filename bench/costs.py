"""Micro-measurements of forward-pass cost, and the analytic speedup bound they imply.

The bound (Leviathan et al. 2023): with per-position acceptance rate a and k drafts per round,
a round emits (1 - a^(k+1)) / (1 - a) tokens on average and costs k draft steps plus one
verify pass over k + 1 tokens, against one target step per token without speculation.
"""

import time
from dataclasses import dataclass

import torch

from daemon.runtime.device import synchronize
from daemon.runtime.model.batch import ForwardBatch, LogitsMode
from daemon.runtime.model.protocol import CausalLM

CONTEXT_LEN = 128  # cached tokens before the measured pass, typical of the bench prompts
REPEATS = 20


def forward_seconds(
    model: CausalLM, num_tokens: int, batch: int = 1, repeats: int = REPEATS
) -> float:
    """Median seconds of one pass appending `num_tokens` per sequence after CONTEXT_LEN cached
    tokens; the cache is rolled back (start position unchanged) between repeats."""
    return pass_seconds([(model, num_tokens)], batch=batch, repeats=repeats)[0]


# (model, tokens appended per sequence) or (model, tokens, consecutive steps)
PassSpec = tuple[CausalLM, int] | tuple[CausalLM, int, int]


def pass_seconds(passes: list[PassSpec], batch: int = 1, repeats: int = REPEATS) -> list[float]:
    """Median seconds of each pass (a model, tokens appended per sequence after CONTEXT_LEN
    cached ones), measured round robin: repeat r times every pass once before repeat r + 1.
    A ratio of two passes is then taken over the same stretch of time: this machine's speed
    drifts by tens of percent over seconds, and passes timed one block after another would
    carry that drift into their ratio. The cache is rolled back between repeats (the start
    position is unchanged: the pass overwrites what the last one wrote).
    A pass given `steps` runs that many times in a row, each appending after the last, and
    counts their mean: a drafter's k steps after a verify pass, the first of which finds its
    weights evicted by the target's (on a CPU a draft of a few MB runs from the last-level
    cache, a step after the target's from memory: 0.1 against 0.35 ms here)."""
    slots = list(range(batch))
    gen = torch.Generator().manual_seed(0)
    models = list({id(spec[0]): spec[0] for spec in passes}.values())
    chunks: list[list[ForwardBatch]] = []
    times: list[list[float]] = [[] for _ in passes]
    try:
        with torch.inference_mode():
            for model in models:
                context = torch.randint(0, model.vocab_size, (batch, CONTEXT_LEN), generator=gen)
                model.forward(ForwardBatch(slots, context.tolist(), [0] * batch, LogitsMode.NONE))
            for spec in passes:
                model, num_tokens = spec[0], spec[1]
                steps = spec[2] if len(spec) == 3 else 1
                chunks.append([
                    ForwardBatch(
                        slots,
                        torch.randint(0, model.vocab_size, (batch, num_tokens), generator=gen)
                        .tolist(),
                        [CONTEXT_LEN + step * num_tokens] * batch,
                        LogitsMode.ALL,
                    )
                    for step in range(steps)
                ])  # fmt: skip
            for _ in range(repeats + 2):  # the first two: warm-up
                for spec, run, seen in zip(passes, chunks, times, strict=True):
                    start = time.perf_counter()
                    for chunk in run:
                        spec[0].forward(chunk)
                    synchronize(spec[0].device)
                    seen.append((time.perf_counter() - start) / len(run))
    finally:  # a pass that raised leaves the models' slots free for what runs next
        for model in models:
            for slot in slots:
                model.free_slot(slot)
    return [sorted(seen[2:])[repeats // 2] for seen in times]


def expected_tokens_per_round(acceptance: float, k: int) -> float:
    """(1 - a^(k+1)) / (1 - a): expected tokens per round with i.i.d. acceptance a."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


@dataclass(slots=True)
class SpeedupBound:
    acceptance: float
    k: int
    target_step_s: float  # target pass over 1 token
    verify_s: float  # target pass over k + 1 tokens
    draft_step_s: float  # draft pass over 1 token, the mean of k in a row after a verify pass

    @property
    def cost_ratio(self) -> float:
        """Target cost per token over draft cost per token (the c of the papers, inverted)."""
        return self.target_step_s / self.draft_step_s

    @property
    def speedup(self) -> float:
        round_cost = self.k * self.draft_step_s + self.verify_s
        return expected_tokens_per_round(self.acceptance, self.k) * self.target_step_s / round_cost


def end_to_end_bound(wall_s: float, prefill_s: float, decode_speedup: float) -> float:
    """The speedup of a whole run (Amdahl) when only its decoding, wall_s - prefill_s of
    target-only's run, goes decode_speedup times faster and its prefill does not. Prefill is
    compute bound on a CPU, so beside a weight-read-bound decode step it costs (per token)
    far more than it would on a GPU, and it caps what the run as a whole can gain."""
    return wall_s / (prefill_s + (wall_s - prefill_s) / decode_speedup)


def chain_ceiling(
    draft: CausalLM, prompts: list[list[int]], outputs: list[list[int]], slot: int = 0
) -> float | None:
    """The most any chain of greedy drafts from `draft` can speed up decoding `outputs` (the
    target's greedy continuations of `prompts`): with k unbounded, drafts free and a verify
    pass as cheap as one target step, a round emits the draft's run of agreement with the
    target and one more token, and costs a step. No i.i.d. acceptance is assumed: the rounds
    are counted on the outputs, from the draft's prediction at every position of them. What
    a faster engine cannot get past; only drafts that agree more (or trees of them) can.
    The first token of each output comes from prefill, and is not counted; None where no
    output has a second. The draft's guesses come from one pass over each whole sequence,
    not step by step as the engine drafts: on a near tie the two can round apart, so this
    is the ceiling up to such ties."""
    tokens = rounds = 0
    try:
        with torch.inference_mode():
            for prompt, output in zip(prompts, outputs, strict=True):
                if len(output) < 2:
                    continue
                sequence = prompt + output[:-1]
                logits = draft.forward(ForwardBatch([slot], [sequence], [0], LogitsMode.ALL))
                assert logits is not None
                # [1, T, V] -> the draft's guess for output[j], j >= 1, at position P - 1 + j
                guesses = logits[0, len(prompt) : len(sequence)].argmax(dim=-1).tolist()
                agree = [g == o for g, o in zip(guesses, output[1:], strict=True)]
                tokens += len(agree)
                # a round ends at each disagreement (the target's token is its bonus), and the
                # last round at the end of the output
                rounds += agree.count(False) + (1 if agree[-1] else 0)
    finally:
        draft.free_slot(slot)
    return tokens / rounds if rounds else None


def speedup_bound(target: CausalLM, draft: CausalLM, acceptance: float, k: int) -> SpeedupBound:
    """The bound with each cost measured as the engine runs it: a target step, a verify pass
    of k + 1 tokens, and then k draft steps in a row (the draft's price per step)."""
    target_step, verify, draft_step = pass_seconds([(target, 1), (target, k + 1), (draft, 1, k)])
    return SpeedupBound(
        acceptance=acceptance,
        k=k,
        target_step_s=target_step,
        verify_s=verify,
        draft_step_s=draft_step,
    )
