"""Response bodies of the OpenAI API (whole responses, stream chunks, the model list).

`token_ids` / `prompt_token_ids` are vLLM's `return_token_ids` extension: present only when the
request asked for them.
"""

from typing import Literal

from pydantic import BaseModel, Field

OWNER = "specctl"


def _absent_if_none(value: object) -> bool:
    return value is None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, num_prompt_tokens: int, num_output_tokens: int) -> "Usage":
        return cls(
            prompt_tokens=num_prompt_tokens,
            completion_tokens=num_output_tokens,
            total_tokens=num_prompt_tokens + num_output_tokens,
        )


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = Field(default=None, exclude_if=_absent_if_none)
    token_ids: list[int] | None = Field(default=None, exclude_if=_absent_if_none)


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = Field(default=None, exclude_if=_absent_if_none)


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: None = None
    prompt_token_ids: list[int] | None = Field(default=None, exclude_if=_absent_if_none)


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = Field(default=None, exclude_if=_absent_if_none)
    content: str | None = Field(default=None, exclude_if=_absent_if_none)


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = Field(default=None, exclude_if=_absent_if_none)


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = Field(default=None)
    system_fingerprint: None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = OWNER
    root: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
