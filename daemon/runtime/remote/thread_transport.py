"""A real DraftTransport in one process: the DraftServer runs on a thread of its own.

Messages cross as bytes, one reply each, handled in the order sent — the same contract as the
Ray transport — so overlapped speculation runs in one process and tests exercise the real
protocol. `latency_s` emulates a network round trip (half each way; the reply becomes
visible only after its half has passed). Faults can be injected on cue: `kill()` (the server
dies: pending and later calls fail), `hang()` (it stops answering: calls time out) and
`restart(server)` (a new server instance takes over, as Ray restarts an actor).
"""

import queue
import threading
import time

from daemon.runtime.remote.draft_server import DraftServer
from daemon.runtime.remote.transport import DrafterUnavailable

_STOP = None  # inbox sentinel: the server thread exits
CLOSE_JOIN_TIMEOUT_S = 10.0  # close() waits this long for the server to finish a message


class PendingReply:
    """One message in flight (a `PendingCall`), completed or failed by its transport."""

    def __init__(self, payload: bytes, epoch: int) -> None:
        self.payload = payload
        self.epoch = epoch  # the server generation it was sent to
        self.sent_at = time.monotonic()
        self._event = threading.Event()
        self._reply: bytes | None = None
        self._error: DrafterUnavailable | None = None
        self._ready_at = 0.0

    def complete(self, reply: bytes, ready_at: float) -> None:
        self._reply, self._ready_at = reply, ready_at
        self._event.set()

    def fail(self, message: str) -> None:
        if not self._event.is_set():
            self._error = DrafterUnavailable(message)
            self._event.set()

    def done(self) -> bool:
        return self._event.is_set() and time.monotonic() >= self._ready_at

    def result(self, timeout_s: float) -> bytes:
        deadline = time.monotonic() + timeout_s
        if not self._event.wait(max(0.0, timeout_s)):
            raise DrafterUnavailable(f"the draft server did not answer within {timeout_s:.3g} s")
        if self._error is not None:
            raise self._error
        delay = self._ready_at - time.monotonic()
        if delay > 0:
            time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
            if time.monotonic() < self._ready_at:
                raise DrafterUnavailable(f"the draft reply arrived after {timeout_s:.3g} s")
        assert self._reply is not None
        return self._reply


class ThreadTransport:
    def __init__(
        self, server: DraftServer, *, latency_s: float = 0.0, name: str = "draft-server"
    ) -> None:
        if latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        self.name = name
        self.one_way_s = latency_s / 2
        self._lock = threading.Lock()
        self._epoch = 0
        self._state = "closed"
        self._inbox: queue.Queue[PendingReply | None] = queue.Queue()
        self._pending: set[PendingReply] = set()
        self.server = server
        self._start(server)

    # -- DraftTransport ---------------------------------------------------------------------
    def call(self, payload: bytes, timeout_s: float) -> bytes:
        return self.call_async(payload).result(timeout_s)

    def call_async(self, payload: bytes) -> PendingReply:
        with self._lock:
            call = PendingReply(bytes(payload), self._epoch)
            if self._state == "dead":
                call.fail("the draft server is dead")
            elif self._state == "closed":
                call.fail("the transport is closed")
            else:
                self._pending.add(call)
                self._inbox.put(call)
        return call

    def close(self) -> None:
        """Stop the server thread: pending calls fail; a message being handled is finished
        first (bounded wait), so no thread is left working on the model."""
        self._stop("closed", "the transport is closed")
        if self._thread is not threading.current_thread():
            self._thread.join(CLOSE_JOIN_TIMEOUT_S)

    # -- fault injection --------------------------------------------------------------------
    def kill(self) -> None:
        """The server dies: calls in flight and every later call fail (DrafterUnavailable)."""
        self._stop("dead", "the draft server died")

    def hang(self) -> None:
        """The server stops answering: calls stay unanswered until their timeouts."""
        with self._lock:
            self._state = "hung"
            self._epoch += 1  # the thread drops whatever it is working on and exits
            self._inbox.put(_STOP)

    def restart(self, server: DraftServer) -> None:
        """A new server instance takes over; calls sent to the old one fail."""
        self._stop("dead", "the draft server was restarted")
        self.server = server
        self._start(server)

    # -- the server thread ------------------------------------------------------------------
    def _start(self, server: DraftServer) -> None:
        with self._lock:
            self._inbox = queue.Queue()
            self._state = "running"
            epoch = self._epoch
            self._thread = threading.Thread(
                target=self._serve, args=(server, self._inbox, epoch), name=self.name, daemon=True
            )
        self._thread.start()

    def _stop(self, state: str, message: str) -> None:
        with self._lock:
            self._state = state
            self._epoch += 1
            self._inbox.put(_STOP)
            pending, self._pending = self._pending, set()
        for call in pending:
            call.fail(message)

    def _serve(
        self, server: DraftServer, inbox: "queue.Queue[PendingReply | None]", epoch: int
    ) -> None:
        while True:
            call = inbox.get()
            if call is _STOP or self._epoch != epoch:
                return
            wait_s = call.sent_at + self.one_way_s - time.monotonic()
            if wait_s > 0:
                time.sleep(wait_s)
            reply = server.handle(call.payload)
            with self._lock:
                if self._epoch != epoch:  # killed, hung or restarted meanwhile
                    return
                self._pending.discard(call)
            call.complete(reply, ready_at=time.monotonic() + self.one_way_s)
