"""The verifier's state of one running request."""

import random
import time
from dataclasses import dataclass, field

import torch

from daemon.runtime.engine.acceptance import AcceptanceEstimate
from daemon.runtime.engine.request import Request, RequestDelta, RequestOutput
from daemon.runtime.engine.stop import StopChecker
from daemon.runtime.sampling.keyed_random import draft_seed_for


@dataclass(slots=True)
class Sequence:
    """Invariant between rounds: the target's KV cache holds token_ids[:-1] for this slot
    (while the prompt is still being prefilled, chunk by chunk: its first num_prefilled)."""

    request: Request
    slot: int
    stop: StopChecker
    acceptance: AcceptanceEstimate
    token_ids: list[int] = field(default_factory=list)  # prompt + output
    generator: torch.Generator | None = None  # None for greedy requests
    draft_seed: int = 0  # keys the proposer's sampled drafts (see sampling/keyed_random.py)
    finish_reason: str | None = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_rounds: int = 0
    num_prefilled: int = 0  # prompt tokens in the target's cache (all of them once it runs)
    # tokens the drafter first feeds when it next drafts for this sequence: its prompt until
    # it first drafts (a draft model prefills it then), and what rounds without drafts
    # committed since (0: it drafted in the last round and holds every token but the newest
    # one or two)
    drafter_behind: int = 0
    # the drafter is taking its tokens in over rounds (prefill_chunk_tokens): asked for drafts,
    # it got none while behind; until its first drafts, drafter_behind is not what a round fed
    drafter_feeding: bool = False
    num_reported: int = 0  # output tokens already handed out in deltas
    finish_reported: bool = False  # a delta with the finish reason was handed out
    started_s: float = field(default_factory=time.perf_counter)
    finished_s: float = 0.0

    def __post_init__(self) -> None:
        self.token_ids = list(self.request.prompt_token_ids)
        params = self.request.params
        if not params.is_greedy:
            seed = params.seed if params.seed is not None else random.getrandbits(63)
            self.generator = torch.Generator().manual_seed(seed)
            self.draft_seed = draft_seed_for(params.seed)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, token_ids: list[int]) -> int:
        """Commit tokens one by one until a stop condition; returns how many were appended."""
        for count, token in enumerate(token_ids, start=1):
            self.token_ids.append(token)
            self.finish_reason = self.stop.check(self.token_ids, self.num_prompt_tokens)
            if self.finish_reason is not None:
                self.finished_s = time.perf_counter()
                return count
        return len(token_ids)

    def finish(self, reason: str) -> None:
        """End the sequence from outside (abort, engine failure)."""
        if self.finish_reason is None:
            self.finish_reason = reason
            self.finished_s = time.perf_counter()

    def take_delta(self) -> RequestDelta | None:
        """The output tokens not yet reported (and the finish reason), or None if nothing new."""
        num_output = self.num_output_tokens
        if num_output == self.num_reported and (not self.is_finished or self.finish_reported):
            return None
        start = self.num_prompt_tokens + self.num_reported
        self.num_reported = num_output
        self.finish_reported = self.is_finished
        return RequestDelta(
            request_id=self.request.request_id,
            new_token_ids=self.token_ids[start:],
            finish_reason=self.finish_reason,
            num_prompt_tokens=self.num_prompt_tokens,
            num_output_tokens=num_output,
            num_draft_tokens=self.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens,
        )

    def to_output(self) -> RequestOutput:
        end = self.finished_s if self.is_finished else time.perf_counter()
        return RequestOutput(
            request_id=self.request.request_id,
            prompt_token_ids=list(self.request.prompt_token_ids),
            token_ids=self.output_ids,
            finish_reason=self.finish_reason,
            num_draft_tokens=self.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens,
            num_rounds=self.num_rounds,
            elapsed_s=end - self.started_s,
        )
