"""`DraftTransport` over Ray: the draft server lives in a drafter actor on another node.

A call is one actor task (`handle(payload) -> reply`); Ray delivers the reply to this process
as soon as the drafter returns it, so an asynchronous call's reply is already here when the
verifier asks for it (no round trip at that moment). Calls from one caller to one actor run in
the order they were sent. Every failure (actor dead or restarting, node gone, timeout, an
exception in the actor) becomes `DrafterUnavailable`.
"""

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
