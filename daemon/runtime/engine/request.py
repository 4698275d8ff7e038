"""What a caller hands the engine, and what it gets back."""

from dataclasses import dataclass, field

from daemon.runtime.sampling.params import SamplingParams


@dataclass(slots=True)
class Request:
    """One generation request: a tokenised prompt and how to sample its continuation."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass(slots=True)
class RequestOutput:
    """The finished (or, when streaming, partial) result of one request."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens only
    finish_reason: str | None  # "stop" | "length" | None while running
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_rounds: int = 0
    elapsed_s: float = 0.0  # from admission to the last token

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(slots=True)
class RequestDelta:
    """What one engine step added to one request: its new tokens, and the finish reason when
    the request ended in this step. Counts are running totals, so the last delta of a request
    carries its final figures."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | None while running
    num_prompt_tokens: int
    num_output_tokens: int  # generated so far, including new_token_ids
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    error: str | None = None  # why, when finish_reason == "error"

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
