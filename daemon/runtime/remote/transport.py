"""How the verifier side reaches the draft server: opaque byte messages, one reply each.

The wire format (`wire.py`) is the only thing both sides share; a transport just carries
bytes. `ThreadTransport` (in this process, the server on a thread of its own) and the Ray
transport (`daemon/shard/ray_transport.py`, the server in a drafter actor on another node)
implement the same surface, so the remote proposer and its tests do not know which one runs.

Every wait has a timeout. A transport turns every failure to deliver or answer a call (the
drafter died, its node is gone, the call timed out) into `DrafterUnavailable`.
"""

from typing import Protocol

from daemon.runtime.errors import SpecError


class DrafterUnavailable(SpecError):
    """The draft server did not answer: it died, its node is gone, or the call timed out."""


class PendingCall(Protocol):
    """A call in flight; its reply is delivered to this process as soon as it is ready."""

    def done(self) -> bool:
        """Whether the reply (or the failure) has arrived; never blocks."""
        ...

    def result(self, timeout_s: float) -> bytes:
        """The reply, waiting at most `timeout_s`; raises DrafterUnavailable."""
        ...


class DraftTransport(Protocol):
    def call(self, payload: bytes, timeout_s: float) -> bytes:
        """Send one message and wait for its reply; raises DrafterUnavailable."""
        ...

    def call_async(self, payload: bytes) -> PendingCall:
        """Send one message without waiting. Calls are handled in the order they are sent."""
        ...

    def close(self) -> None:
        """Release the transport (threads, handles); pending calls fail."""
        ...
