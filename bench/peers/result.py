"""The measurement one peer engine returns to `specctl bench`, comparable across engines."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PeerResult:
    """One engine's timed run over a prompt set (warm-up excluded, model loading excluded).

    mode: "sequential" (batch 1, one request after another) or "concurrent-N".
    num_tokens: generated tokens over all requests; tokens_per_s = num_tokens / wall_s.
    acceptance_rate: accepted / proposed draft tokens; mean_acceptance_length: tokens per target
    verify step (1 + accepted / verify steps). Both None where the engine speculates not or
    does not say.
    load_s: seconds spent loading models and starting the engine, outside wall_s.
    output_token_ids: the generated ids per request, in prompt order (for losslessness checks).
    """

    engine: str
    mode: str
    num_requests: int
    num_tokens: int
    wall_s: float
    tokens_per_s: float
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    note: str = ""
    load_s: float | None = None
    output_token_ids: list[list[int]] | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PeerResult:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def tokens_per_second(num_tokens: int, wall_s: float) -> float:
    """Throughput, 0.0 for an empty or instantaneous run rather than a division error."""
    return num_tokens / wall_s if wall_s > 0 else 0.0


def acceptance_figures(
    num_drafts: float, num_draft_tokens: float, num_accepted: float
) -> tuple[float | None, float | None]:
    """(acceptance rate, mean acceptance length) from spec-decode counters; None where undefined.

    num_drafts counts verify steps that carried draft tokens, num_draft_tokens the proposed
    tokens, num_accepted those the target kept. Mean acceptance length counts the target's own
    bonus/correction token, so it is 1 + accepted per step.
    """
    rate = num_accepted / num_draft_tokens if num_draft_tokens > 0 else None
    length = 1.0 + num_accepted / num_drafts if num_drafts > 0 else None
    return rate, length
