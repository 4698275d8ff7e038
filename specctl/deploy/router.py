"""Data parallelism: several independent replicas (each a verifier with its drafter) behind
one `EngineBackend`.

Each request goes to the live replica with the fewest outstanding tokens (prompt tokens not
yet prefilled plus output tokens still to generate, summed over its requests in flight).
Replicas share nothing at run time — no collective, no common step — so an idle replica never
blocks a busy one. A replica that refuses as stopped (its verifier is dead or restarting) is
skipped and retried after `retry_after_s`; the others keep serving.
"""

import logging
import threading
import time
from dataclasses import dataclass, field, replace

from daemon.runtime.engine.loop import LoopOutput, Sink
from daemon.runtime.engine.request import Request
from daemon.runtime.errors import EngineOverloadedError, EngineStoppedError, RequestError
from specctl.server.backend import EngineBackend, ServedModel

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 5.0


@dataclass(slots=True)
class _Work:
    prompt_tokens: int  # not yet prefilled (0 once the first token came)
    output_tokens: int  # still to generate, at most

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass(slots=True)
class _Replica:
    index: int
    backend: EngineBackend
    outstanding: dict[str, _Work] = field(default_factory=dict)  # request id -> work left
    down_until: float = 0.0  # monotonic time before which no request is sent here
    num_requests: int = 0  # requests routed here so far
    num_running: int = 0  # its engine's gauges, as last reported
    num_waiting: int = 0

    @property
    def load(self) -> int:
        return sum(w.tokens for w in self.outstanding.values())


class RouterBackend:
    def __init__(self, replicas: list[EngineBackend], retry_after_s: float = RETRY_AFTER_S):
        if not replicas:
            raise ValueError("a router needs at least one replica")
        first = replicas[0].model
        for other in replicas[1:]:
            if other.model.vocab_size != first.vocab_size:
                raise ValueError("replicas must serve the same model (vocabularies differ)")
        # what the endpoint holds at once is every replica's batch and queue: one replica's
        # refused groups of prompts the others had room for (frontend.py's all-or-none check)
        each = [r.model.max_requests for r in replicas]
        total = None if None in each else sum(n for n in each if n is not None)
        self.model: ServedModel = replace(first, max_requests=total)
        self._replicas = [_Replica(i, b) for i, b in enumerate(replicas)]
        self._retry_after_s = retry_after_s
        self._lock = threading.Lock()
        self._owner: dict[str, _Replica] = {}  # request id -> replica serving it
        self._sink: Sink | None = None

    def start(self, sink: Sink) -> None:
        self._sink = sink
        for replica in self._replicas:
            replica.backend.start(self._replica_sink(replica))

    def submit(self, request: Request) -> None:
        work = _Work(len(request.prompt_token_ids), request.params.max_tokens)
        tried: dict[int, str] = {}  # replica index -> why it did not take the request
        while True:
            replica = self._pick(set(tried))
            if replica is None:
                reasons = [f"replica {i}: {why}" for i, why in tried.items()] or ["all are down"]
                raise EngineStoppedError("no replica can take the request: " + "; ".join(reasons))
            with self._lock:
                if request.request_id in self._owner:
                    raise RequestError(f"request id {request.request_id!r} is already in use")
                self._owner[request.request_id] = replica
                replica.outstanding[request.request_id] = work
            try:
                replica.backend.submit(request)
            except (EngineStoppedError, EngineOverloadedError) as exc:
                self._release(request.request_id)
                if isinstance(exc, EngineStoppedError):
                    self._mark_down(replica, str(exc))
                tried[replica.index] = str(exc)
                continue
            except BaseException:
                self._release(request.request_id)
                raise
            with self._lock:
                replica.num_requests += 1
            return

    def abort(self, request_id: str) -> None:
        with self._lock:
            replica = self._owner.get(request_id)
        if replica is not None:
            replica.backend.abort(request_id)

    def stop(self) -> None:
        for replica in self._replicas:
            replica.backend.stop()

    def replica_loads(self) -> list[tuple[int, int, bool]]:
        """(requests routed, outstanding tokens, is up) per replica, for status and tests."""
        now = time.monotonic()
        with self._lock:
            return [(r.num_requests, r.load, r.down_until <= now) for r in self._replicas]

    # -- internals --------------------------------------------------------------------------
    def _pick(self, exclude: set[int]) -> _Replica | None:
        """The live replica with the least outstanding work, not among `exclude`."""
        now = time.monotonic()
        with self._lock:
            live = [r for r in self._replicas if r.down_until <= now and r.index not in exclude]
            return min(live, key=lambda r: (r.load, r.index), default=None)

    def _mark_down(self, replica: _Replica, reason: str) -> None:
        logger.warning("replica %d is down (%s); retrying it later", replica.index, reason)
        with self._lock:
            replica.down_until = time.monotonic() + self._retry_after_s

    def _release(self, request_id: str) -> None:
        with self._lock:
            replica = self._owner.pop(request_id, None)
            if replica is not None:
                replica.outstanding.pop(request_id, None)

    def _replica_sink(self, replica: _Replica) -> Sink:
        def sink(output: LoopOutput) -> None:
            with self._lock:
                for delta in output.deltas:
                    work = replica.outstanding.get(delta.request_id)
                    if delta.finished:
                        replica.outstanding.pop(delta.request_id, None)
                        self._owner.pop(delta.request_id, None)
                    elif work is not None:
                        work.prompt_tokens = 0
                        work.output_tokens -= len(delta.new_token_ids)
                replica.num_running, replica.num_waiting = output.num_running, output.num_waiting
                # the endpoint's gauges count every replica
                output.num_running = sum(r.num_running for r in self._replicas)
                output.num_waiting = sum(r.num_waiting for r in self._replicas)
            if self._sink is not None:
                self._sink(output)

        return sink
