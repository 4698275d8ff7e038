"""Server-sent events for streamed completions and chat completions.

One chunk per engine round that produced text (a round may carry several tokens), the finish
reason on the chunk that ends a choice, then, with `stream_options.include_usage`, a usage
chunk with `choices: []`, then `data: [DONE]`. A failure after the stream started (the engine
failed, or stopped) is sent as an `{"error": ...}` event before `[DONE]`: the status line is
already gone by then. When the client disconnects, the response ends and the requests still
running are aborted, which frees their slots at the next engine step.
"""

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from specctl.server.errors import OpenAIError
from specctl.server.generation import ChoiceDelta, Generation
from specctl.server.openai_responses import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    CompletionChoice,
    CompletionResponse,
    Usage,
)

DONE = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(payload: BaseModel | dict[str, Any]) -> str:
    if isinstance(payload, BaseModel):
        return f"data: {payload.model_dump_json()}\n\n"
    return f"data: {json.dumps(payload)}\n\n"


class StreamHeader:
    """What every chunk of one response repeats."""

    def __init__(self, response_id: str, model: str, include_usage: bool, with_ids: bool) -> None:
        self.id = response_id
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage
        self.with_ids = with_ids


UsageChunk = Callable[[Usage], BaseModel]


async def _events(
    gen: Generation,
    chunk_of: Callable[[ChoiceDelta], BaseModel | None],
    usage_chunk: UsageChunk | None,
) -> AsyncIterator[str]:
    try:
        async for delta in gen.deltas():
            chunk = chunk_of(delta)
            if chunk is not None:
                yield sse(chunk)
        if usage_chunk is not None:  # counts are final only now
            yield sse(usage_chunk(Usage.of(gen.num_prompt_tokens, gen.num_output_tokens)))
    except OpenAIError as exc:
        yield sse(exc.body())
    yield DONE


def completion_events(gen: Generation, head: StreamHeader) -> AsyncIterator[str]:
    def chunk_of(d: ChoiceDelta) -> BaseModel | None:
        if not d.text and d.finish_reason is None and not head.with_ids:
            return None
        choice = CompletionChoice(
            index=d.index,
            text=d.text,
            finish_reason=d.finish_reason,
            token_ids=d.token_ids if head.with_ids else None,
        )
        return CompletionResponse(
            id=head.id, created=head.created, model=head.model, choices=[choice]
        )

    def usage_chunk(usage: Usage) -> BaseModel:
        return CompletionResponse(
            id=head.id, created=head.created, model=head.model, choices=[], usage=usage
        )

    return _events(gen, chunk_of, usage_chunk if head.include_usage else None)


def chat_events(gen: Generation, head: StreamHeader) -> AsyncIterator[str]:
    started: set[int] = set()

    def chunk_of(d: ChoiceDelta) -> BaseModel | None:
        if not d.text and d.finish_reason is None and not head.with_ids and d.index in started:
            return None
        delta = ChatDelta(content=d.text)
        if d.index not in started:  # the first chunk of a choice names the role
            started.add(d.index)
            delta.role = "assistant"
        choice = ChatChunkChoice(
            index=d.index,
            delta=delta,
            finish_reason=d.finish_reason,
            token_ids=d.token_ids if head.with_ids else None,
        )
        return ChatCompletionChunk(
            id=head.id, created=head.created, model=head.model, choices=[choice]
        )

    def usage_chunk(usage: Usage) -> BaseModel:
        return ChatCompletionChunk(
            id=head.id, created=head.created, model=head.model, choices=[], usage=usage
        )

    return _events(gen, chunk_of, usage_chunk if head.include_usage else None)


class SSEResponse(StreamingResponse):
    """A streamed response that aborts its generation however it ends (client gone, server
    shutting down, or done: then aborting is a no-op)."""

    def __init__(self, events: AsyncIterator[str], gen: Generation) -> None:
        super().__init__(events, media_type="text/event-stream", headers=SSE_HEADERS)
        self._gen = gen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._gen.abort()
