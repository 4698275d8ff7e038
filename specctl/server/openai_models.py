"""Request bodies of the OpenAI API, as pydantic models that check themselves.

Ranges and types are refused by pydantic (the error names the parameter; errors.py turns it
into a 400 with `param`). Parameters this server does not implement are refused when set to
anything but their neutral value (n > 1, logprobs, tools, penalties, ...), so that a client
never silently gets something other than what it asked for. Unknown fields are accepted and
ignored (clients send newer fields all the time); the handlers log their names.

vLLM extensions accepted: `top_k`, `ignore_eos`, `stop_token_ids`, `return_token_ids`. vLLM's
other sampling and output extensions (`min_tokens`, `repetition_penalty`, `min_p`, guided
decoding, ...) are refused unless neutral, as OpenAI's are: a client moving from vLLM would
otherwise get other output than it asked for, with nothing to tell it.
"""

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
)

from daemon.runtime.sampling.params import (
    MAX_SEED,
    MAX_STOP_STRING_BYTES,
    MAX_STOP_STRINGS,
    MAX_TOP_K,
    MIN_SEED,
)
from daemon.runtime.text_checks import stop_string_problem

MAX_TEMPERATURE = 100.0  # the engine's limit (OpenAI documents 0..2; vLLM takes more)
MAX_STOP_TOKEN_IDS = 64


def _json_number(value: Any) -> Any:
    """A number as JSON sends one: true, false and strings are refused. Read leniently,
    `"max_tokens": true` was 1 token and `"temperature": "0.7"` was 0.7; OpenAI refuses both.
    A float with no fraction is still an integer (16.0: what some JSON encoders write)."""
    if isinstance(value, bool | str):
        raise ValueError(
            f"must be a number, not {'a boolean' if isinstance(value, bool) else 'a string'}"
        )
    return value


JsonInt = Annotated[int, BeforeValidator(_json_number)]
JsonFloat = Annotated[float, BeforeValidator(_json_number)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    @property
    def ignored_fields(self) -> list[str]:
        return sorted(self.model_extra or {})


class StreamOptions(_Body):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False  # vLLM's; accepted, usage comes once at the end


def _refuse_unless(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


# vLLM's extensions this server does not implement: each accepted absent, null or at its
# neutral value (what vLLM does without it), refused otherwise
VLLM_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "min_tokens": (0,),
    "min_p": (0.0,),
    "repetition_penalty": (1.0,),
    "length_penalty": (1.0,),
    "use_beam_search": (False,),
    "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "truncate_prompt_tokens": (),
    "prompt_logprobs": (),
    "allowed_token_ids": (),
    "bad_words": ([],),
    "logits_processors": ([],),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "structured_outputs": (),
}
VLLM_CHAT_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "echo": (False,),
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    "chat_template": (),
    "chat_template_kwargs": ({},),
}


def _vllm_neutral(name: str, value: Any, table: dict[str, tuple[Any, ...]]) -> Any:
    neutral = table[name]
    # type first: 1 == True and 0 == False in Python, and a bool is no number here
    ok = value is None or any(type(value) is type(n) and value == n for n in neutral)
    if not ok and isinstance(value, int | float) and not isinstance(value, bool):
        ok = any(type(n) is float and value == n for n in neutral)  # 1 for 1.0
    shown = " or ".join(json.dumps(n) for n in neutral) or "null"
    _refuse_unless(ok, f"{name} (a vLLM extension) is not supported: it must be absent or {shown}")
    return value


class _SamplingBody(_Body):
    """Fields shared by completions and chat completions."""

    model: str | None = None  # None: the one served model
    max_tokens: JsonInt | None = Field(default=None, ge=1)
    temperature: JsonFloat | None = Field(default=None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: JsonFloat | None = Field(default=None, gt=0.0, le=1.0)
    top_k: JsonInt | None = Field(default=None, ge=-1, le=MAX_TOP_K)  # -1 or 0: off (vLLM's)
    seed: JsonInt | None = Field(default=None, ge=MIN_SEED, le=MAX_SEED)
    stop: str | list[str] | None = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    n: JsonInt | None = 1
    presence_penalty: JsonFloat | None = 0.0
    frequency_penalty: JsonFloat | None = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # accepted and ignored
    metadata: dict[str, Any] | None = None  # accepted and ignored
    ignore_eos: StrictBool = False
    stop_token_ids: list[StrictInt] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    return_token_ids: StrictBool = False
    min_tokens: Any = None
    min_p: Any = None
    repetition_penalty: Any = None
    length_penalty: Any = None
    use_beam_search: Any = None
    include_stop_str_in_output: Any = None
    skip_special_tokens: Any = None
    spaces_between_special_tokens: Any = None
    truncate_prompt_tokens: Any = None
    prompt_logprobs: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    logits_processors: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None

    @field_validator(*VLLM_NEUTRAL)
    @classmethod
    def _vllm_extension(cls, value: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None
        return _vllm_neutral(info.field_name, value, VLLM_NEUTRAL)

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int | None) -> int | None:
        _refuse_unless(n in (None, 1), f"only n = 1 is supported, got {n}")
        return n

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None) -> float | None:
        _refuse_unless(
            value in (None, 0.0), f"penalties are not supported (must be 0), got {value}"
        )
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        _refuse_unless(not value, "logit_bias is not supported")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        _refuse_unless(
            len(stops) <= MAX_STOP_STRINGS,
            f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}",
        )
        for stop in stops:
            problem = stop_string_problem(stop, MAX_STOP_STRING_BYTES)
            _refuse_unless(problem is None, problem or "")
        return value

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, value: list[int] | None) -> list[int] | None:
        _refuse_unless(
            all(0 <= t <= MAX_TOP_K for t in value or []),
            f"stop_token_ids must be in [0, {MAX_TOP_K}]",
        )
        return value

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    # a tool-calling conversation's turns: refused like `tools` (they were dropped silently,
    # so the model saw a conversation other than the one sent)
    tool_calls: list[Any] | None = None
    function_call: Any = None

    @field_validator("tool_calls", "function_call")
    @classmethod
    def _no_tool_calls(cls, value: Any) -> Any:
        _refuse_unless(not value, "tool and function calling are not supported")
        return value

    @property
    def text(self) -> str:
        """The content as one string (text parts joined by newlines, as vLLM does)."""
        if isinstance(self.content, list):
            return "\n".join(part.text for part in self.content)
        return self.content or ""


class ResponseFormat(_Body):
    type: str


class ChatCompletionRequest(_SamplingBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: JsonInt | None = Field(default=None, ge=1)
    logprobs: StrictBool | None = False
    top_logprobs: JsonInt | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: ResponseFormat | None = None
    parallel_tool_calls: StrictBool | None = None  # meaningless without tools; ignored
    echo: Any = None
    add_generation_prompt: Any = None
    continue_final_message: Any = None
    chat_template: Any = None
    chat_template_kwargs: Any = None

    @field_validator(*VLLM_CHAT_NEUTRAL)
    @classmethod
    def _vllm_chat_extension(cls, value: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None
        return _vllm_neutral(info.field_name, value, VLLM_CHAT_NEUTRAL)

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: bool | None) -> bool | None:
        _refuse_unless(not value, "logprobs are not supported")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, value: int | None) -> int | None:
        _refuse_unless(not value, "top_logprobs is not supported")
        return value

    @field_validator("tools", "functions")
    @classmethod
    def _no_tools(cls, value: list[Any] | None) -> list[Any] | None:
        _refuse_unless(not value, "tool and function calling are not supported")
        return value

    @field_validator("tool_choice", "function_call")
    @classmethod
    def _no_tool_choice(cls, value: Any) -> Any:
        _refuse_unless(value in (None, "none"), "tool and function calling are not supported")
        return value

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: ResponseFormat | None) -> ResponseFormat | None:
        _refuse_unless(
            value is None or value.type == "text",
            f"only response_format type 'text' is supported, got {value.type if value else ''!r}",
        )
        return value

    @property
    def max_output_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


Prompt = str | list[StrictInt] | list[str] | list[list[StrictInt]]


class CompletionRequest(_SamplingBody):
    prompt: Prompt
    max_tokens: JsonInt | None = Field(default=16, ge=1)  # OpenAI's and vLLM's default
    logprobs: JsonInt | None = None
    echo: StrictBool | None = False
    suffix: str | None = None
    best_of: JsonInt | None = None

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: int | None) -> int | None:
        _refuse_unless(value is None, "logprobs are not supported")
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool | None) -> bool | None:
        _refuse_unless(not value, "echo is not supported")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        _refuse_unless(not value, "suffix is not supported")
        return value

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: int | None) -> int | None:
        _refuse_unless(value in (None, 1), f"only best_of = 1 is supported, got {value}")
        return value

    @property
    def max_output_tokens(self) -> int | None:
        return self.max_tokens
