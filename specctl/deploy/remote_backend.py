"""An `EngineBackend` whose engine runs in a verifier shard on another node.

Requests go to the shard with a Ray call each; a poller thread long-polls the shard for the
engine's outputs and hands them to the endpoint's sink. If the shard dies or stops answering,
every request in flight ends with an error within `call_timeout_s` (no client waits forever),
and the poller keeps trying: a shard restarted by Ray serves new requests again.
"""

import logging
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daemon.runtime.engine.builder import load_tokenizer
from daemon.runtime.engine.loop import LoopOutput, Sink
from daemon.runtime.engine.request import Request, RequestDelta
from daemon.runtime.engine.stop import FINISH_ERROR
from daemon.runtime.errors import EngineOverloadedError, EngineStoppedError, RequestError
from daemon.shard.tokenizer_files import write_tokenizer_files
from daemon.shard.verifier import PollReply, SubmitResult, VerifierInfo
from specctl.server.backend import ServedModel

logger = logging.getLogger(__name__)

POLL_WAIT_S = 0.5  # the shard answers at once when there is output; this bounds an idle poll
CALL_TIMEOUT_S = 30.0  # beyond the poll's own wait: a shard silent this long is down
RETRY_BACKOFF_S = 1.0


@dataclass(slots=True)
class _InFlight:
    num_prompt_tokens: int
    instance_id: str | None  # the shard instance holding it (None until it answered)


def _ray() -> Any:
    import ray

    return ray


class RemoteBackend:
    def __init__(
        self,
        verifier: Any,  # a Ray actor handle of a VerifierShard
        model: ServedModel,
        *,
        call_timeout_s: float = CALL_TIMEOUT_S,
        poll_wait_s: float = POLL_WAIT_S,
        actor_name: str | None = None,
    ) -> None:
        self.model = model
        self._verifier = verifier
        # a shard replaced under the same name (a re-apply) is found again by it
        self._actor_name = actor_name
        self._call_timeout_s = call_timeout_s
        self._poll_wait_s = poll_wait_s
        self._lock = threading.Lock()
        self._in_flight: dict[str, _InFlight] = {}
        self._instance_id: str | None = None  # the shard instance the poller last heard
        self._dead: set[str] = set()  # instances found dead or replaced
        self._stopping = threading.Event()
        self._sink: Sink | None = None
        self._poller = threading.Thread(
            target=self._poll_forever, name="verifier-poll", daemon=True
        )

    def start(self, sink: Sink) -> None:
        self._sink = sink
        self._poller.start()

    def submit(self, request: Request) -> None:
        ray = _ray()
        if self._stopping.is_set():
            raise EngineStoppedError("the server is shutting down")
        with self._lock:
            if request.request_id in self._in_flight:
                raise RequestError(f"request id {request.request_id!r} is already in use")
            self._in_flight[request.request_id] = _InFlight(len(request.prompt_token_ids), None)
        try:
            result: SubmitResult = ray.get(
                self._verifier.submit.remote(request), timeout=self._call_timeout_s
            )
        except Exception as exc:  # the shard died, its node is gone, or it did not answer
            self._forget(request.request_id)
            raise EngineStoppedError(f"the verifier shard is unreachable: {_reason(exc)}") from None
        if not result.accepted:
            self._forget(request.request_id)
            raise _refusal(result)
        with self._lock:
            if result.instance_id in self._dead:  # taken by an instance that died since
                self._in_flight.pop(request.request_id, None)
                raise EngineStoppedError("the verifier shard restarted; the request was lost")
            entry = self._in_flight.get(request.request_id)
            if entry is not None:
                entry.instance_id = result.instance_id

    def abort(self, request_id: str) -> None:
        try:
            self._verifier.abort.remote(request_id)
        except Exception as exc:
            logger.warning("abort of %s not delivered: %s", request_id, _reason(exc))

    def stop(self) -> None:
        """Stop polling and end what is in flight here; the shard itself keeps running (it
        belongs to the deployment, and `specctl down` stops it)."""
        self._stopping.set()
        if self._poller.is_alive():
            self._poller.join(self._poll_wait_s + self._call_timeout_s)
        with self._lock:
            self._dead.update(e.instance_id for e in self._in_flight.values() if e.instance_id)
        self._fail_in_flight("the server is shutting down")

    # -- the poller thread ------------------------------------------------------------------
    def _poll_forever(self) -> None:
        ray = _ray()
        while not self._stopping.is_set():
            try:
                reply: PollReply = ray.get(
                    self._verifier.poll.remote(self._poll_wait_s),
                    timeout=self._poll_wait_s + self._call_timeout_s,
                )
            except Exception as exc:
                self._mark_dead(self._instance_id)
                self._fail_in_flight(f"the verifier shard is unreachable: {_reason(exc)}")
                self._stopping.wait(RETRY_BACKOFF_S)
                self._find_again()
                continue
            if reply.instance_id != self._instance_id:
                if self._instance_id is not None:
                    self._mark_dead(self._instance_id)
                    self._fail_in_flight("the verifier shard restarted; its requests were lost")
                self._instance_id = reply.instance_id
            with self._lock:  # it answered: alive after all (a poll that merely timed out)
                self._dead.discard(reply.instance_id)
            if reply.output is not None:
                self._deliver(reply.output)

    def _find_again(self) -> None:
        if self._actor_name is None:
            return
        from specctl.deploy.actors import find_actor

        try:
            handle = find_actor(self._actor_name)
        except Exception:
            return
        if handle is not None:
            self._verifier = handle

    def _deliver(self, output: LoopOutput) -> None:
        with self._lock:
            for delta in output.deltas:
                if delta.finished:
                    self._in_flight.pop(delta.request_id, None)
        if self._sink is not None:
            self._sink(output)

    def _mark_dead(self, instance_id: str | None) -> None:
        if instance_id is not None:
            with self._lock:
                self._dead.add(instance_id)

    def _fail_in_flight(self, message: str) -> None:
        """End with an error every request held by a dead shard instance. A request whose
        submit call is still out is left to that call: it fails there, or its answer names
        the instance that took it (failed at once if that one is dead too)."""
        with self._lock:
            lost = {
                rid: entry
                for rid, entry in self._in_flight.items()
                if entry.instance_id is not None and entry.instance_id in self._dead
            }
            for rid in lost:
                del self._in_flight[rid]
        if not lost or self._sink is None:
            return
        logger.error("%s (%d requests ended)", message, len(lost))
        for rid in lost:  # a shard that was only slow frees their slots
            self.abort(rid)
        deltas = [
            RequestDelta(rid, [], FINISH_ERROR, entry.num_prompt_tokens, 0, error=message)
            for rid, entry in lost.items()
        ]
        self._sink(LoopOutput(deltas=deltas, time_s=time.time()))

    def _forget(self, request_id: str) -> None:
        with self._lock:
            self._in_flight.pop(request_id, None)


def _refusal(result: SubmitResult) -> Exception:
    if result.kind == "request":
        return RequestError(result.message)
    if result.kind == "overloaded":
        return EngineOverloadedError(result.message)
    return EngineStoppedError(result.message)


def _reason(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def served_model(verifier: Any, name: str, timeout_s: float) -> ServedModel:
    """Wait for the shard to load, then describe its model (tokenizer fetched from the shard,
    so the serving machine needs no copy of the model directory)."""
    ray = _ray()
    deadline = time.monotonic() + timeout_s
    status = ray.get(verifier.wait_ready.remote(timeout_s), timeout=timeout_s + CALL_TIMEOUT_S)
    if status.state != "ready":
        raise EngineStoppedError(
            f"the verifier shard on {status.node_name} is {status.state}"
            + (f": {status.error}" if status.error else "")
        )
    left_s = max(1.0, deadline - time.monotonic())
    info: VerifierInfo = ray.get(verifier.info.remote(), timeout=left_s)
    files = ray.get(verifier.tokenizer_files.remote(), timeout=left_s + CALL_TIMEOUT_S)
    with tempfile.TemporaryDirectory(prefix="specctl-tok-") as tmp:  # loaded into memory
        tokenizer = load_tokenizer(write_tokenizer_files(files, Path(tmp)))
    return ServedModel(
        name=name,
        max_model_len=info.max_model_len,
        vocab_size=info.vocab_size,
        tokenizer=tokenizer,
        proposer=info.proposer,
        num_speculative_tokens=info.num_speculative_tokens,
        adaptive=info.adaptive,
        max_batch_size=info.max_batch_size,
        max_requests=None if info.max_waiting is None else info.max_batch_size + info.max_waiting,
    )
