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
    slots = list(range(batch))
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(0, model.vocab_size, (batch, CONTEXT_LEN), generator=gen).tolist()
    chunk = torch.randint(0, model.vocab_size, (batch, num_tokens), generator=gen).tolist()
    with torch.inference_mode():
        model.forward(ForwardBatch(slots, context, [0] * batch, LogitsMode.NONE))
        times = []
        for _ in range(repeats + 2):
            start = time.perf_counter()
            model.forward(ForwardBatch(slots, chunk, [CONTEXT_LEN] * batch, LogitsMode.ALL))
            synchronize(model.device)
            times.append(time.perf_counter() - start)
    for slot in slots:
        model.free_slot(slot)
    return sorted(times[2:])[len(times[2:]) // 2]


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
    draft_step_s: float  # draft pass over 1 token

    @property
    def cost_ratio(self) -> float:
        """Target cost per token over draft cost per token (the c of the papers, inverted)."""
        return self.target_step_s / self.draft_step_s

    @property
    def speedup(self) -> float:
        round_cost = self.k * self.draft_step_s + self.verify_s
        return expected_tokens_per_round(self.acceptance, self.k) * self.target_step_s / round_cost


def speedup_bound(target: CausalLM, draft: CausalLM, acceptance: float, k: int) -> SpeedupBound:
    return SpeedupBound(
        acceptance=acceptance,
        k=k,
        target_step_s=forward_seconds(target, 1),
        verify_s=forward_seconds(target, k + 1),
        draft_step_s=forward_seconds(draft, 1),
    )
