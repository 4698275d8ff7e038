"""The engine's step loop in a thread of its own.

Requests and aborts come in from any thread (HTTP handlers, a Ray actor's method calls); the
loop thread alone touches the engine: it drains the inbox, runs one `step()`, and hands what
the step produced to a sink. New requests therefore join the running batch at the next step
(continuous batching), and an abort frees its slot at the next step.
"""

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.request import Request, RequestDelta
from daemon.runtime.engine.stats import RoundStats
from daemon.runtime.engine.stop import FINISH_ERROR
from daemon.runtime.errors import EngineOverloadedError, EngineStoppedError, RequestError

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_MAX_WAITING = 256  # requests queued beyond the running batch before new ones are refused
STOP_TIMEOUT_S = 30.0


@dataclass(slots=True)
class LoopOutput:
    """What the loop reports after a step (or several, merged): picklable, so a verifier shard
    can hand it to the serving process unchanged."""

    deltas: list[RequestDelta] = field(default_factory=list)
    rounds: list[RoundStats] = field(default_factory=list)  # one per step that did work
    num_running: int = 0  # after the last step
    num_waiting: int = 0  # queued in the engine or the inbox, not yet running
    time_s: float = field(default_factory=time.time)  # wall clock of the last step's end

    def merge(self, later: "LoopOutput") -> None:
        """Fold a later output into this one (deltas in order, gauges from the later)."""
        self.deltas.extend(later.deltas)
        self.rounds.extend(later.rounds)
        self.num_running, self.num_waiting = later.num_running, later.num_waiting
        self.time_s = later.time_s


Sink = Callable[[LoopOutput], None]


class EngineLoop:
    """Owns a `SpecEngine` and the thread that drives it."""

    def __init__(
        self,
        engine: SpecEngine,
        sink: Sink,
        *,
        max_waiting: int = DEFAULT_MAX_WAITING,
        name: str = "engine-loop",
    ) -> None:
        if max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {max_waiting}")
        self.engine = engine
        self._sink = sink
        self._capacity = engine.config.max_batch_size + max_waiting
        self._cond = threading.Condition()
        self._inbox: deque[tuple[str, Request | str | Callable[[SpecEngine], None]]] = deque()
        self._in_flight: set[str] = set()  # submitted and not yet ended
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # -- any thread -------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, request: Request) -> None:
        """Queue a request for the next step. Raises RequestError if it can never be served,
        EngineOverloadedError when the queue is full, EngineStoppedError after `stop()`."""
        self.engine.check_request(request)
        with self._cond:
            if self._stopping:
                raise EngineStoppedError("the engine is shutting down")
            if request.request_id in self._in_flight:
                raise RequestError(f"request id {request.request_id!r} is already in use")
            if len(self._in_flight) >= self._capacity:
                raise EngineOverloadedError(
                    f"the engine has {len(self._in_flight)} requests in flight "
                    f"(at most {self._capacity}); retry later"
                )
            self._in_flight.add(request.request_id)
            self._inbox.append(("add", request))
            self._cond.notify()

    def call_between_steps(self, fn: Callable[[SpecEngine], T], timeout_s: float) -> T:
        """Run `fn(engine)` on the loop thread between two steps (the only thread that may
        touch the engine) and wait for it; returns its value, or raises its exception here."""
        done = threading.Event()
        outcome: list[BaseException] = []
        values: list[T] = []

        def run(engine: SpecEngine) -> None:
            try:
                values.append(fn(engine))
            except BaseException as exc:
                outcome.append(exc)
            finally:
                done.set()

        with self._cond:
            if self._stopping:
                raise EngineStoppedError("the engine is shutting down")
            self._inbox.append(("call", run))
            self._cond.notify()
        if not done.wait(timeout_s):
            raise EngineStoppedError(f"the engine did not take the change within {timeout_s:g} s")
        if outcome:
            raise outcome[0]
        return values[0]

    def abort(self, request_id: str) -> None:
        """End a request early (no-op if it already ended); its slot is freed at the next step."""
        with self._cond:
            if request_id in self._in_flight:
                self._inbox.append(("abort", request_id))
                self._cond.notify()

    @property
    def num_in_flight(self) -> int:
        with self._cond:
            return len(self._in_flight)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """End every request in flight with an error, then the thread (within `timeout_s`)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.error("engine loop did not stop within %.0f s", timeout_s)

    # -- the loop thread --------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._inbox and not self._stopping and not self.engine.has_unfinished():
                    self._cond.wait()
                if self._stopping:
                    break
                ops = list(self._inbox)
                self._inbox.clear()
            output = LoopOutput(deltas=self._apply(ops))
            if self.engine.has_unfinished():
                self._step(output)
            self._emit(output)
        self._shut_down()

    def _shut_down(self) -> None:
        """End what is still queued or running, so that every caller gets a last delta."""
        message = "the engine is shutting down"
        with self._cond:
            ops = list(self._inbox)
            self._inbox.clear()
        for kind, item in ops:  # let waiting callers return instead of timing out
            if kind == "call" and callable(item):
                item(self.engine)
        unstarted = [
            RequestDelta(r.request_id, [], FINISH_ERROR, len(r.prompt_token_ids), 0, message)
            for kind, r in ops
            if kind == "add" and isinstance(r, Request)
        ]
        self._emit(LoopOutput(deltas=unstarted + self.engine.fail_all(message)))

    def _apply(
        self, ops: list[tuple[str, Request | str | Callable[[SpecEngine], None]]]
    ) -> list[RequestDelta]:
        """Hand queued adds, aborts and calls to the engine, in the order they came."""
        refused: list[RequestDelta] = []
        for kind, item in ops:
            if kind == "call":
                assert callable(item)
                item(self.engine)
                continue
            if kind == "abort":
                assert isinstance(item, str)
                self.engine.abort(item)
                continue
            assert isinstance(item, Request)
            try:
                self.engine.add_request(item)
            except RequestError as exc:
                refused.append(
                    RequestDelta(
                        item.request_id, [], FINISH_ERROR, len(item.prompt_token_ids), 0, str(exc)
                    )
                )
        return refused

    def _step(self, output: LoopOutput) -> None:
        def prefilled(firsts: list[RequestDelta]) -> None:
            # the new requests' first tokens (and what `_apply` refused) go out now, not
            # after the round: a stream's time to first token is its prefill's, not a round's
            early = LoopOutput(deltas=[*output.deltas, *firsts])
            output.deltas = []
            self._emit(early)

        try:
            step = self.engine.step(prefilled)
        except Exception as exc:  # a failed step leaves no state worth keeping
            logger.exception("engine step failed; ending every request in flight")
            output.deltas.extend(self.engine.fail_all(f"engine step failed: {exc}"))
            return
        output.deltas.extend(step.deltas)
        if step.stats.batch_size or step.stats.num_prefill_seqs:
            output.rounds.append(step.stats)

    def _emit(self, output: LoopOutput) -> None:
        with self._cond:
            for delta in output.deltas:
                if delta.finished:
                    self._in_flight.discard(delta.request_id)
            output.num_running = self.engine.num_running
            output.num_waiting = self.engine.num_waiting + sum(
                1 for kind, _ in self._inbox if kind == "add"
            )
        output.time_s = time.time()
        if not output.deltas and not output.rounds:
            return
        try:
            self._sink(output)
        except Exception:
            logger.exception("engine loop sink failed")
