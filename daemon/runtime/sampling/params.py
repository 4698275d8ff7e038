"""Per-request sampling parameters, validated at the edge."""

from dataclasses import dataclass, field

from daemon.runtime.errors import RequestError
from daemon.runtime.text_checks import stop_string_problem

MAX_STOP_STRINGS = 16
MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed takes
MAX_STOP_STRING_BYTES = 512  # UTF-8 bytes of one stop string (stop.py looks back that far)
MAX_TOP_K = 2**31 - 1  # past any vocabulary; keeps top_k a machine integer
# Temperatures below this sample greedily, as vLLM does: the distribution's limit as T -> 0
# is the argmax, and dividing float32 logits by a smaller T overflows (a temperature of
# 1e-154 once turned the drafter's probabilities into NaN and a request into a 500).
MIN_TEMPERATURE = 1e-5


@dataclass(slots=True)
class SamplingParams:
    """How one request samples. `temperature == 0` means greedy (argmax); so does any
    temperature below MIN_TEMPERATURE, which is stored as 0."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k truncation
    max_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()  # stop strings, matched on the decoded text
    seed: int | None = None
    ignore_eos: bool = False
    extra_eos_token_ids: tuple[int, ...] = field(default=(), repr=False)  # from the tokenizer

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise RequestError(f"temperature must be in [0, 100], got {self.temperature}")
        if self.temperature < MIN_TEMPERATURE:
            self.temperature = 0.0
        if self.seed is not None and not MIN_SEED <= self.seed <= MAX_SEED:
            raise RequestError(f"seed must be in [{MIN_SEED}, {MAX_SEED}], got {self.seed}")
        if not 0.0 < self.top_p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.top_k <= MAX_TOP_K:
            raise RequestError(
                f"top_k must be in [0, {MAX_TOP_K}] (0 disables it), got {self.top_k}"
            )
        if self.max_tokens < 1:
            raise RequestError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise RequestError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        for stop in self.stop:
            if problem := stop_string_problem(stop, MAX_STOP_STRING_BYTES):
                raise RequestError(problem)
        if any(not 0 <= t <= MAX_TOP_K for t in self.stop_token_ids):
            raise RequestError(
                f"stop_token_ids must be in [0, {MAX_TOP_K}], got {list(self.stop_token_ids)}"
            )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0
