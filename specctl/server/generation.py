"""One HTTP request's engine requests, from submission to the last token, as text.

`Generation` submits the requests (one per prompt), turns their token deltas into text deltas
per choice (incremental detokenization, stop strings), keeps the usage counts, and aborts the
requests still running when the client goes away. Completions and chat completions both run
on it; only the shape of what they send differs.
"""

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request as HttpRequest

from daemon.runtime.engine.request import Request, RequestDelta
from daemon.runtime.engine.stop import FINISH_ABORT, FINISH_ERROR
from daemon.runtime.errors import EngineOverloadedError, EngineStoppedError, RequestError
from specctl.server.detokenizer import IncrementalDetokenizer
from specctl.server.errors import SERVER_ERROR, OpenAIError, invalid_param
from specctl.server.frontend import Frontend, RequestGroup

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 1


@dataclass(slots=True)
class ChoiceDelta:
    """New text of one choice (and its finish reason once it ended)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass(slots=True)
class Choice:
    """A finished choice."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None


def backend_error(exc: Exception, prompt_param: str) -> OpenAIError:
    """What the backend's refusal means to an OpenAI client."""
    if isinstance(exc, EngineOverloadedError):
        return OpenAIError(
            429,
            f"the server is at capacity: {exc}",
            type="rate_limit_exceeded",
            code="engine_overloaded",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    if isinstance(exc, EngineStoppedError):
        return OpenAIError(503, str(exc), type=SERVER_ERROR, code="engine_stopped")
    return invalid_param(prompt_param, str(exc))


class Generation:
    def __init__(
        self,
        frontend: Frontend,
        requests: list[Request],
        tokenizer: Any,
        stop: tuple[str, ...],
        prompt_param: str,
    ) -> None:
        self._frontend = frontend
        self._requests = requests
        self._prompt_param = prompt_param
        self._detokenizers = [
            IncrementalDetokenizer(tokenizer, r.prompt_token_ids, stop) for r in requests
        ]
        self.choices = [
            Choice(index=i, prompt_token_ids=list(r.prompt_token_ids))
            for i, r in enumerate(requests)
        ]
        self.num_prompt_tokens = sum(len(r.prompt_token_ids) for r in requests)
        self.num_output_tokens = 0
        self._group: RequestGroup | None = None

    async def start(self) -> None:
        """Queue the requests; refused ones raise an OpenAIError (400, 429 or 503)."""
        try:
            self._group = await self._frontend.submit(self._requests)
        except (RequestError, EngineOverloadedError, EngineStoppedError) as exc:
            raise backend_error(exc, self._prompt_param) from exc

    async def deltas(self) -> AsyncIterator[ChoiceDelta]:
        """Text deltas until every choice has finished; an engine failure raises a 500."""
        assert self._group is not None, "start() first"
        try:
            frontend = self._frontend
            async for index, delta in self._group.deltas(
                frontend.idle_timeout_s, lambda: frontend.last_output_s
            ):
                if delta.finish_reason in (FINISH_ERROR, FINISH_ABORT):
                    raise self._failure(delta)
                choice = self.choices[index]
                text = self._detokenizers[index].add(delta.new_token_ids, delta.finished)
                choice.token_ids.extend(delta.new_token_ids)
                self.num_output_tokens += len(delta.new_token_ids)
                if delta.finished:
                    choice.finish_reason = delta.finish_reason
                    choice.text = self._detokenizers[index].text
                yield ChoiceDelta(index, text, delta.new_token_ids, delta.finish_reason)
        except TimeoutError:
            raise OpenAIError(
                500,
                f"no output from the engine for {self._frontend.idle_timeout_s:.0f} s",
                type=SERVER_ERROR,
            ) from None
        finally:
            self.abort()

    def _failure(self, delta: RequestDelta) -> OpenAIError:
        why = delta.error or delta.finish_reason
        if self._frontend.is_stopping:  # ended by a shutdown, not by a fault
            return OpenAIError(503, f"the server is stopping: {why}", type=SERVER_ERROR)
        return OpenAIError(500, f"generation failed: {why}", type=SERVER_ERROR)

    def abort(self) -> None:
        """End whatever is still running (no-op once every choice has finished)."""
        if self._group is not None and self._group.num_open:
            self._frontend.abort(self._group)

    async def collect(self, http_request: HttpRequest) -> list[Choice]:
        """Run to the end; if the client disconnects first, abort and raise ClientGone."""
        drain = asyncio.ensure_future(self._drain())
        gone = asyncio.ensure_future(_wait_disconnect(http_request))
        try:
            await asyncio.wait({drain, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not drain.done():
                drain.cancel()
                drain.add_done_callback(_retrieve)  # should it end by an error after all
                self.abort()
        if not drain.done() or drain.cancelled():
            raise ClientGone()
        drain.result()  # re-raises an OpenAIError from the stream
        return self.choices

    async def _drain(self) -> None:
        async for _ in self.deltas():
            pass


def _retrieve(task: "asyncio.Future[None]") -> None:
    """Read a given-up task's outcome: unread, asyncio logs it as an error with a traceback."""
    if not task.cancelled():
        task.exception()


class ClientGone(Exception):
    """The client disconnected before its response was ready."""


async def _wait_disconnect(http_request: HttpRequest) -> None:
    while True:
        message = await http_request.receive()
        if message["type"] == "http.disconnect":
            return
