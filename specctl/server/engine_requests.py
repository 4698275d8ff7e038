"""From a validated OpenAI request body to engine requests: the model, the prompt token ids, the
sampling parameters and the context check.

Tokenisation matches `specctl generate` (`tokenizer.encode(text)`) for completions, so greedy
output through the endpoint is the same as from the command line; chat prompts go through the
tokenizer's chat template. Context rules follow vLLM: a prompt must leave room for at least one
token, an explicit max_tokens must fit beside the prompt, and an unset one is the room left
(for completions OpenAI's default of 16, clamped to the room left).
"""

from daemon.runtime.engine.request import Request
from daemon.runtime.errors import RequestError
from daemon.runtime.sampling.params import SamplingParams
from daemon.runtime.text_checks import lone_surrogate_at
from specctl.server.backend import ServedModel
from specctl.server.errors import OpenAIError, invalid_param
from specctl.server.openai_models import ChatCompletionRequest, CompletionRequest

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
DEFAULT_TEMPERATURE = 1.0  # OpenAI's (and vLLM's, absent a generation config)


def check_model(requested: str | None, model: ServedModel) -> None:
    if requested is not None and requested != model.name:
        raise OpenAIError(
            404,
            f"the model {requested!r} does not exist; this server serves {model.name!r}",
            param="model",
            code="model_not_found",
        )


def check_stream_options(body: CompletionRequest | ChatCompletionRequest) -> None:
    if body.stream_options is not None and not body.stream:
        raise invalid_param("stream_options", "stream_options is only allowed with stream: true")


def completion_prompts(body: CompletionRequest, model: ServedModel) -> list[list[int]]:
    """Token ids of each prompt: a string, token ids, or a list of either (one choice each)."""
    prompt = body.prompt
    if isinstance(prompt, str):
        items: list[str | list[int]] = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        items = [prompt]  # type: ignore[list-item]
    else:
        items = list(prompt)  # type: ignore[arg-type]
    if not items:
        raise invalid_param("prompt", "prompt: the prompt is empty")
    if model.max_requests is not None and len(items) > model.max_requests:
        # a 429 (retry later) could never succeed: the engine holds no more at once
        raise invalid_param(
            "prompt",
            f"prompt: {len(items)} prompts in one request; this server takes at most "
            f"{model.max_requests} at once (its batch and its queue)",
        )
    prompts = []
    for i, item in enumerate(items):
        param = "prompt" if len(items) == 1 else f"prompt[{i}]"
        if isinstance(item, str):
            check_text(item, param)
            ids = model.tokenizer.encode(item)
        else:
            ids = list(item)
        _check_ids(ids, model, param)
        prompts.append(ids)
    return prompts


def chat_prompt(body: ChatCompletionRequest, model: ServedModel) -> list[int]:
    """The conversation through the tokenizer's chat template, with the assistant's turn open."""
    tokenizer = model.tokenizer
    if not getattr(tokenizer, "chat_template", None):
        raise invalid_param(
            "messages", f"the model {model.name!r} has no chat template; use /v1/completions"
        )
    for i, message in enumerate(body.messages):
        check_text(message.text, f"messages[{i}].content")
    messages = [{"role": m.role, "content": m.text} for m in body.messages]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # jinja raises its own errors (raise_exception in templates)
        raise invalid_param(
            "messages", f"messages: the chat template refused them ({exc})"
        ) from exc
    ids = tokenizer.encode(text, add_special_tokens=False)
    _check_ids(ids, model, "messages")
    return ids


def check_text(text: str | None, param: str) -> None:
    """Text the tokenizer can take: JSON may carry a lone UTF-16 surrogate (\\ud800), which is
    no character, and the tokenizer raised TypeError on it (a 500)."""
    if text and (at := lone_surrogate_at(text)) is not None:
        raise invalid_param(
            param,
            f"{param}: holds a lone surrogate (U+{ord(text[at]):04X}) at character {at}, "
            "which is not a character; send valid Unicode text",
        )


def _check_ids(ids: list[int], model: ServedModel, param: str) -> None:
    if not ids:
        raise invalid_param(param, f"{param}: the prompt is empty")
    bad = [t for t in ids if not 0 <= t < model.vocab_size]
    if bad:
        raise invalid_param(
            param,
            f"{param}: token ids {bad[:5]} are outside the vocabulary [0, {model.vocab_size})",
        )
    if len(ids) >= model.max_model_len:
        raise invalid_param(
            param,
            f"this model's maximum context length is {model.max_model_len} tokens, but the "
            f"prompt has {len(ids)} tokens (at least one must be left for the output)",
            code=CONTEXT_LENGTH_EXCEEDED,
        )


def max_tokens_for(
    body: CompletionRequest | ChatCompletionRequest, num_prompt_tokens: int, model: ServedModel
) -> int:
    room = model.max_model_len - num_prompt_tokens
    if isinstance(body, ChatCompletionRequest):
        param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        explicit = body.max_output_tokens
    else:
        param = "max_tokens"
        explicit = body.max_tokens if "max_tokens" in body.model_fields_set else None
        if explicit is None:
            return min(body.max_tokens or room, room)
    if explicit is None:
        return room
    if explicit > room:
        raise invalid_param(
            param,
            f"this model's maximum context length is {model.max_model_len} tokens, but "
            f"{num_prompt_tokens} prompt tokens + {param} {explicit} = "
            f"{num_prompt_tokens + explicit}; lower {param} to at most {room}",
            code=CONTEXT_LENGTH_EXCEEDED,
        )
    return explicit


def sampling_params(
    body: CompletionRequest | ChatCompletionRequest, num_prompt_tokens: int, model: ServedModel
) -> SamplingParams:
    temperature = DEFAULT_TEMPERATURE if body.temperature is None else body.temperature
    try:
        return SamplingParams(
            temperature=temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=max(body.top_k or 0, 0),
            max_tokens=max_tokens_for(body, num_prompt_tokens, model),
            stop=body.stop_strings,
            stop_token_ids=tuple(body.stop_token_ids or ()),
            seed=body.seed,
            ignore_eos=body.ignore_eos,
        )
    except RequestError as exc:  # the pydantic models check the same ranges; a backstop
        raise invalid_param(None, str(exc)) from exc


def engine_requests(
    request_id: str,
    prompts: list[list[int]],
    body: CompletionRequest | ChatCompletionRequest,
    model: ServedModel,
) -> list[Request]:
    return [
        Request(f"{request_id}-{i}", ids, sampling_params(body, len(ids), model))
        for i, ids in enumerate(prompts)
    ]
