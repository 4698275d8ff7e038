"""The two generation endpoints: validated body in, a JSON response or an event stream out."""

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable

from pydantic import BaseModel
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from specctl.server.backend import ServedModel
from specctl.server.engine_requests import (
    chat_prompt,
    check_model,
    check_stream_options,
    completion_prompts,
    engine_requests,
)
from specctl.server.frontend import Frontend
from specctl.server.generation import Choice, ClientGone, Generation
from specctl.server.openai_models import ChatCompletionRequest, CompletionRequest
from specctl.server.openai_responses import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionResponse,
    Usage,
)
from specctl.server.streaming import SSEResponse, StreamHeader, chat_events, completion_events

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left; nobody reads it


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def _start(
    frontend: Frontend,
    body: CompletionRequest | ChatCompletionRequest,
    prefix: str,
    prompts_of: Callable[[ServedModel], list[list[int]]],
    prompt_param: str,
) -> tuple[Generation, StreamHeader]:
    """Check the model and options, tokenise, queue: the running generation and its header."""
    model = frontend.backend.model
    check_model(body.model, model)
    check_stream_options(body)
    head = StreamHeader(_new_id(prefix), model.name, body.include_usage, body.return_token_ids)
    # tokenising (a long prompt, or many) off the event loop: other clients' streams and
    # /health go on meanwhile
    requests = await asyncio.to_thread(
        lambda: engine_requests(head.id, prompts_of(model), body, model)
    )
    gen = Generation(frontend, requests, model.tokenizer, body.stop_strings, prompt_param)
    await gen.start()
    return gen, head


async def _respond(
    gen: Generation,
    head: StreamHeader,
    http: HttpRequest,
    stream: bool,
    events: Callable[[Generation, StreamHeader], AsyncIterator[str]],
    build: Callable[[list[Choice]], BaseModel],
) -> Response:
    """The event stream, or the whole response once every choice has finished (499 when the
    client left first)."""
    if stream:
        return SSEResponse(events(gen, head), gen)
    try:
        choices = await gen.collect(http)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return JSONResponse(build(choices).model_dump(mode="json"))


async def create_completion(
    body: CompletionRequest, http: HttpRequest, frontend: Frontend
) -> Response:
    gen, head = await _start(
        frontend, body, "cmpl", lambda m: completion_prompts(body, m), "prompt"
    )
    with_ids = head.with_ids

    def build(choices: list[Choice]) -> CompletionResponse:
        return CompletionResponse(
            id=head.id,
            created=head.created,
            model=head.model,
            choices=[
                CompletionChoice(
                    index=c.index,
                    text=c.text,
                    finish_reason=c.finish_reason,
                    prompt_token_ids=c.prompt_token_ids if with_ids else None,
                    token_ids=c.token_ids if with_ids else None,
                )
                for c in choices
            ],
            usage=Usage.of(gen.num_prompt_tokens, gen.num_output_tokens),
        )

    return await _respond(gen, head, http, body.stream, completion_events, build)


async def create_chat_completion(
    body: ChatCompletionRequest, http: HttpRequest, frontend: Frontend
) -> Response:
    gen, head = await _start(
        frontend, body, "chatcmpl", lambda m: [chat_prompt(body, m)], "messages"
    )
    with_ids = head.with_ids

    def build(choices: list[Choice]) -> ChatCompletionResponse:
        return ChatCompletionResponse(
            id=head.id,
            created=head.created,
            model=head.model,
            choices=[
                ChatChoice(
                    index=c.index,
                    message=AssistantMessage(content=c.text),
                    finish_reason=c.finish_reason,
                    token_ids=c.token_ids if with_ids else None,
                )
                for c in choices
            ],
            usage=Usage.of(gen.num_prompt_tokens, gen.num_output_tokens),
            prompt_token_ids=choices[0].prompt_token_ids if with_ids else None,
        )

    return await _respond(gen, head, http, body.stream, chat_events, build)
