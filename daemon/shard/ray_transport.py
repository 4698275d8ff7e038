"""`DraftTransport` over Ray: the draft server lives in a drafter actor on another node.

A call is one actor task (`handle(payload) -> reply`); Ray delivers the reply to this process
as soon as the drafter returns it, so an asynchronous call's reply is already here when the
verifier asks for it (no round trip at that moment). Calls from one caller to one actor run in
the order they were sent. Every failure (actor dead or restarting, node gone, timeout, an
exception in the actor) becomes `DrafterUnavailable`.
"""

import threading
import time
from collections.abc import Callable
from typing import Any

from daemon.runtime.remote.transport import DrafterUnavailable


def _unavailable(exc: BaseException) -> DrafterUnavailable:
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return DrafterUnavailable(f"drafter call failed ({type(exc).__name__}: {first_line[:200]})")


class RayPendingCall:
    def __init__(self, ref: Any) -> None:
        self._ref = ref

    def done(self) -> bool:
        import ray

        ready, _ = ray.wait([self._ref], timeout=0, fetch_local=True)
        return bool(ready)

    def result(self, timeout_s: float) -> bytes:
        import ray

        try:
            reply = ray.get(self._ref, timeout=max(timeout_s, 0.0))
        except Exception as exc:  # GetTimeoutError, RayActorError, RayTaskError, ...
            raise _unavailable(exc) from None
        if not isinstance(reply, bytes):
            raise DrafterUnavailable(f"drafter replied with {type(reply).__name__}, not bytes")
        return reply


class FailedCall:
    """A call that could not even be sent: done at once, and its result raises."""

    def __init__(self, error: DrafterUnavailable) -> None:
        self._error = error

    def done(self) -> bool:
        return True

    def result(self, timeout_s: float) -> bytes:
        raise self._error


class RayTransport:
    def __init__(self, drafter: Any) -> None:
        self._drafter = drafter  # a Ray actor handle whose `handle(bytes) -> bytes` serves calls

    def call(self, payload: bytes, timeout_s: float) -> bytes:
        return self.call_async(payload).result(timeout_s)

    def call_async(self, payload: bytes) -> RayPendingCall | FailedCall:
        try:
            ref = self._drafter.handle.remote(payload)
        except Exception as exc:  # the handle itself is unusable
            return FailedCall(_unavailable(exc))
        return RayPendingCall(ref)

    def close(self) -> None:
        self._drafter = None


class _Watched:
    """A pending call that tells its transport when it failed (so the next call looks the
    drafter up by name again)."""

    def __init__(self, call: RayPendingCall | FailedCall, on_failure: Callable[[], None]) -> None:
        self._call = call
        self._on_failure = on_failure

    def done(self) -> bool:
        return self._call.done()

    def result(self, timeout_s: float) -> bytes:
        try:
            return self._call.result(timeout_s)
        except DrafterUnavailable:
            self._on_failure()
            raise


class NamedActorTransport:
    """`DraftTransport` to the drafter actor of a given name. The actor is looked up on the
    first call and again after any failed one (at most once per `lookup_interval_s`): a drafter
    restarted by Ray keeps its handle, but one re-created by `apply` (moved to another node) is
    a new actor under the same name, reachable only by looking it up again."""

    def __init__(self, name: str, namespace: str, lookup_interval_s: float = 1.0) -> None:
        self.name = name
        self._namespace = namespace
        self._interval_s = lookup_interval_s
        self._lock = threading.Lock()
        self._transport: RayTransport | None = None
        self._looked_up_at = float("-inf")

    def call(self, payload: bytes, timeout_s: float) -> bytes:
        return self.call_async(payload).result(timeout_s)

    def call_async(self, payload: bytes) -> _Watched:
        transport = self._current()
        if transport is None:
            error = DrafterUnavailable(f"no drafter actor named {self.name!r} is running")
            return _Watched(FailedCall(error), self._forget)
        return _Watched(transport.call_async(payload), self._forget)

    def close(self) -> None:
        with self._lock:
            self._transport = None

    def _forget(self) -> None:
        with self._lock:
            self._transport = None

    def _current(self) -> RayTransport | None:
        with self._lock:
            if self._transport is not None:
                return self._transport
            now = time.monotonic()
            if now - self._looked_up_at < self._interval_s:
                return None
            self._looked_up_at = now
        import ray

        try:
            handle = ray.get_actor(self.name, namespace=self._namespace)
        except Exception:  # ValueError when there is none; anything else: the same to us
            return None
        with self._lock:
            self._transport = RayTransport(handle)
            return self._transport
