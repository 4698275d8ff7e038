"""Between the HTTP handlers and an engine backend: submit, route deltas back, abort.

The backend calls its sink from its own thread; the sink hands each `LoopOutput` to the event
loop with `call_soon_threadsafe`, where it is routed to the asyncio queue of the HTTP request
that owns each delta. `submit` and `abort` may block (a remote backend makes a Ray call), so
they run in a small thread pool, never on the event loop. Timing (time to first token, gaps
between deltas, end to end) is measured here, in the serving process, as clients see it.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from daemon.runtime.engine.loop import LoopOutput
from daemon.runtime.engine.request import Request, RequestDelta
from daemon.runtime.errors import EngineOverloadedError, EngineStoppedError
from specctl.server.backend import EngineBackend

logger = logging.getLogger("specctl.serve")

NUM_BACKEND_THREADS = 8
DEFAULT_IDLE_TIMEOUT_S = 600.0  # no delta for this long: the request is given up as stuck
STOP_TIMEOUT_S = 60.0
START_TIMEOUT_S = 600.0  # a remote backend may be deploying shards
CALL_TIMEOUT_S = 60.0  # one submit: a remote backend makes a Ray call


@dataclass(slots=True)
class RequestTiming:
    """One engine request as the serving process saw it (monotonic seconds)."""

    request_id: str
    arrival_s: float
    first_token_s: float | None = None
    last_token_s: float | None = None
    finished_s: float | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float:
        return (self.finished_s or time.monotonic()) - self.arrival_s


class ServingObserver(Protocol):
    """Told what the serving process sees; called on the event loop, must not block."""

    def on_loop_output(self, output: LoopOutput) -> None: ...

    def on_first_token(self, timing: RequestTiming, delta: RequestDelta) -> None: ...

    def on_tokens(self, num_tokens: int, gap_s: float) -> None:
        """`num_tokens` arrived `gap_s` after the previous delta of their request."""
        ...

    def on_finished(self, timing: RequestTiming, delta: RequestDelta) -> None: ...


@dataclass(slots=True)
class RequestGroup:
    """The engine requests of one HTTP request (one per prompt); their deltas share a queue."""

    request_ids: list[str]
    queue: asyncio.Queue[tuple[int, RequestDelta]] = field(default_factory=asyncio.Queue)
    num_open: int = 0

    def __post_init__(self) -> None:
        self.num_open = len(self.request_ids)

    async def deltas(
        self, idle_timeout_s: float, last_output: Callable[[], float] | None = None
    ) -> AsyncIterator[tuple[int, RequestDelta]]:
        """(index in the group, delta) until every member has finished. TimeoutError when no
        delta came for `idle_timeout_s` and the engine gave none to anyone for as long
        (`last_output`: the monotonic time of its latest; None: this group's alone). A request
        queued behind a full batch gets nothing until a slot frees, which may take longer
        than the timeout while the engine works: given up as stuck, it got a 500."""
        while self.num_open:
            try:
                # not asyncio.wait_for: on Python 3.11 it returns the item when a cancel comes
                # as the item does, and the cancel is lost (a client gone mid-stream left its
                # task running to the abort, whose error nobody read)
                async with asyncio.timeout(idle_timeout_s):
                    index, delta = await self.queue.get()
            except TimeoutError:
                if last_output is not None and time.monotonic() - last_output() < idle_timeout_s:
                    continue  # waiting its turn: the engine is busy with others
                raise
            if delta.finished:
                self.num_open -= 1
            yield index, delta


@dataclass(slots=True)
class _Member:
    group: RequestGroup
    index: int
    timing: RequestTiming
    is_finished: bool = False


class Frontend:
    def __init__(
        self,
        backend: EngineBackend,
        observers: list[ServingObserver],
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    ) -> None:
        self.backend = backend
        self.idle_timeout_s = idle_timeout_s
        self._observers = observers
        self._members: dict[str, _Member] = {}
        self._reserved = 0  # places held for groups being submitted, not yet members
        self._pool = ThreadPoolExecutor(NUM_BACKEND_THREADS, thread_name_prefix="backend-call")
        self._loop: asyncio.AbstractEventLoop | None = None
        self.is_stopping = False
        self.last_output_s = time.monotonic()  # when the engine last gave any request a delta

    # -- lifecycle (event loop) -------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        started = self._loop.run_in_executor(self._pool, self.backend.start, self._sink)
        try:
            await asyncio.wait_for(started, START_TIMEOUT_S)
        except TimeoutError:
            raise EngineStoppedError(
                f"the engine backend did not start within {START_TIMEOUT_S:.0f} s"
            ) from None

    async def stop(self) -> None:
        """Stop the backend (every request in flight gets a last delta), within a bound.
        Only the first call does anything."""
        if self.is_stopping:
            return
        self.is_stopping = True
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(
                loop.run_in_executor(self._pool, self.backend.stop), STOP_TIMEOUT_S
            )
        except TimeoutError:
            logger.error("the engine backend did not stop within %.0f s", STOP_TIMEOUT_S)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- requests (event loop) --------------------------------------------------------------
    async def submit(self, requests: list[Request]) -> RequestGroup:
        """Queue every request of one HTTP request; if one is refused, the ones already queued
        are aborted and the backend's error (RequestError, EngineOverloadedError,
        EngineStoppedError) is raised.

        All or none: where the backend's capacity is known, a group that would not fit beside
        what is in flight and being submitted is refused before any of it is queued. Groups
        submitted at once took places in turns until each met a full engine: every one of
        them got a 429, and the work queued for them was thrown away."""
        self._check_room(len(requests))
        self._reserved += len(requests)
        group = RequestGroup([r.request_id for r in requests])
        now = time.monotonic()
        registered = 0
        try:
            for index, request in enumerate(requests):
                # registered first: its first delta may arrive before submit returns
                self._members[request.request_id] = _Member(
                    group, index, RequestTiming(request.request_id, now)
                )
                registered += 1
                self._reserved -= 1
                call = self._pool.submit(self.backend.submit, request)
                try:
                    async with asyncio.timeout(CALL_TIMEOUT_S):
                        await asyncio.wrap_future(call)
                except TimeoutError:
                    self._forget_after_failure(group, request, index)
                    self._abort_if_it_lands(call, request)
                    raise EngineStoppedError(
                        f"the engine did not take the request within {CALL_TIMEOUT_S:.0f} s"
                    ) from None
                except asyncio.CancelledError:  # the client went away while the call ran
                    self._forget_after_failure(group, request, index)
                    self._abort_if_it_lands(call, request)
                    raise
                except BaseException:
                    self._forget_after_failure(group, request, index)
                    raise
        finally:
            self._reserved -= len(requests) - registered
        return group

    def _abort_if_it_lands(self, call: Future[None], request: Request) -> None:
        """A submit given up on may still be taken: abort it once the call has ended (an
        abort sent beside it could come first, and find nothing to abort)."""

        def abort(done: Future[None]) -> None:  # on the thread that ran the call
            if done.cancelled() or done.exception() is not None:
                return  # never started, or refused: nothing landed
            try:
                self.backend.abort(request.request_id)
            except Exception as exc:
                logger.warning("abort failed: %s", exc)

        call.add_done_callback(abort)

    def _check_room(self, num_requests: int) -> None:
        limit = self.backend.model.max_requests
        held = len(self._members) + self._reserved
        if limit is not None and held + num_requests > limit:
            raise EngineOverloadedError(
                f"{held} requests are in flight and this one brings {num_requests} "
                f"(at most {limit} at once); retry later"
            )

    def _forget_after_failure(self, group: RequestGroup, request: Request, index: int) -> None:
        """`request` was not taken: drop it, and abort the group's requests queued before it."""
        self._members.pop(request.request_id, None)
        group.request_ids = group.request_ids[:index]
        self.abort(group)

    def abort(self, group: RequestGroup) -> None:
        """Abort the group's unfinished requests (a client went away); does not wait."""
        for request_id in group.request_ids:
            member = self._members.get(request_id)
            if member is not None and not member.is_finished:
                future = self._pool.submit(self.backend.abort, request_id)
                future.add_done_callback(_log_failure)

    @property
    def num_open_requests(self) -> int:
        return len(self._members)

    # -- deltas ------------------------------------------------------------------------------
    def _sink(self, output: LoopOutput) -> None:
        """Called from the backend's thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed just now (shutdown)
            loop.call_soon_threadsafe(self._dispatch, output)

    def _dispatch(self, output: LoopOutput) -> None:
        now = time.monotonic()
        if output.deltas:
            self.last_output_s = now
        for observer in self._observers:
            observer.on_loop_output(output)
        for delta in output.deltas:
            member = self._members.get(delta.request_id)
            if member is None:
                continue
            self._observe(member, delta, now)
            member.group.queue.put_nowait((member.index, delta))
            if delta.finished:
                member.is_finished = True
                del self._members[delta.request_id]

    def _observe(self, member: _Member, delta: RequestDelta, now: float) -> None:
        timing = member.timing
        num_new = len(delta.new_token_ids)
        if num_new and timing.first_token_s is None:
            timing.first_token_s = now
            for observer in self._observers:
                observer.on_first_token(timing, delta)
        elif num_new and timing.last_token_s is not None:
            for observer in self._observers:
                observer.on_tokens(num_new, now - timing.last_token_s)
        if num_new:
            timing.last_token_s = now
        if delta.finished:
            timing.finished_s = now
            for observer in self._observers:
                observer.on_finished(timing, delta)


def _log_failure(future: Future[None]) -> None:
    exc = None if future.cancelled() else future.exception()
    if exc is not None:
        logger.warning("abort failed: %s", exc)
