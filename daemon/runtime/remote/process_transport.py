"""A DraftTransport to a DraftServer in a child process of its own, over a pipe.

No Ray and no network: the drafter runs in a separate interpreter (its own GIL, its own
torch threads), so overlapped speculation overlaps for real on one machine. Messages are
bytes, handled in the order sent; a reader thread hands each reply to its call. `kill()`
kills the child (SIGKILL) and `restart()` starts a new one from the same spec (a new
DraftServer instance: a new instance id), for fault tests with real process death.
"""

import contextlib
import multiprocessing
import threading
from collections import deque
from multiprocessing.connection import Connection

from daemon.runtime.remote.builder import DraftServerSpec, build_draft_server
from daemon.runtime.remote.thread_transport import PendingReply
from daemon.runtime.remote.transport import DrafterUnavailable

READY = b"READY"
STOP = b""  # a request is never empty: an empty message asks the child to exit
DEFAULT_START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0


def _serve(conn: Connection, spec: DraftServerSpec, num_threads: int) -> None:
    """The child: build the server, say READY (or the error), answer until STOP or EOF."""
    import torch

    torch.set_num_threads(num_threads)
    try:
        server = build_draft_server(spec)
    except Exception as exc:  # the parent reports it: a child must not die silently
        conn.send_bytes(f"ERROR {type(exc).__name__}: {exc}".encode())
        return
    conn.send_bytes(READY)
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if data == STOP:
            return
        conn.send_bytes(server.handle(data))


class ProcessTransport:
    def __init__(
        self,
        spec: DraftServerSpec,
        *,
        num_threads: int = 1,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        name: str = "draft-server",
    ) -> None:
        self.spec = spec
        self.num_threads = num_threads
        self.start_timeout_s = start_timeout_s
        self.name = name
        self._lock = threading.Lock()  # the pending queue and the open flag
        self._send_lock = threading.Lock()  # a call's place in the queue = its place on the pipe
        self._pending: deque[PendingReply] = deque()
        self._is_open = False
        self._start()

    # -- DraftTransport ---------------------------------------------------------------------
    def call(self, payload: bytes, timeout_s: float) -> bytes:
        return self.call_async(payload).result(timeout_s)

    def call_async(self, payload: bytes) -> PendingReply:
        call = PendingReply(bytes(payload), 0)
        with self._send_lock:
            with self._lock:
                if not self._is_open:
                    call.fail("the draft server process is not running")
                    return call
                self._pending.append(call)
            try:
                self._conn.send_bytes(call.payload)
            except (OSError, ValueError) as exc:
                call.fail(f"cannot reach the draft server process: {exc}")
        return call

    def close(self) -> None:
        """Ask the child to exit (it finishes the message in hand), then make sure it did."""
        with self._send_lock:
            with self._lock:
                was_open, self._is_open = self._is_open, False
            if was_open:
                with contextlib.suppress(OSError, ValueError):
                    self._conn.send_bytes(STOP)
        self._process.join(STOP_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(STOP_TIMEOUT_S)
        self._fail_pending("the transport is closed")
        self._conn.close()

    # -- faults -----------------------------------------------------------------------------
    def kill(self) -> None:
        """SIGKILL the child: calls in flight and later ones fail with DrafterUnavailable."""
        with self._lock:
            self._is_open = False
        self._process.kill()
        self._process.join(STOP_TIMEOUT_S)
        self._fail_pending("the draft server process died")

    def restart(self) -> None:
        """A new child (a new DraftServer instance) replaces the old one."""
        self.close()
        self._start()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    # -- internals --------------------------------------------------------------------------
    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child, self.spec, self.num_threads), name=self.name, daemon=True
        )
        self._process.start()
        child.close()
        if not self._conn.poll(self.start_timeout_s):
            self._process.kill()
            raise DrafterUnavailable(f"the draft server did not start in {self.start_timeout_s} s")
        hello = self._conn.recv_bytes()
        if hello != READY:
            self._process.join(STOP_TIMEOUT_S)
            raise DrafterUnavailable(f"the draft server failed to start: {hello.decode()}")
        with self._lock:
            self._is_open = True
        threading.Thread(target=self._read, args=(self._conn,), daemon=True).start()

    def _read(self, conn: Connection) -> None:
        while True:
            try:
                reply = conn.recv_bytes()
            except (EOFError, OSError):
                break
            with self._lock:
                call = self._pending.popleft() if self._pending else None
            if call is not None:
                call.complete(reply, ready_at=0.0)
        with self._lock:
            if self._conn is not conn:
                return  # a replaced process: its calls were failed when it was replaced
            self._is_open = False
        self._fail_pending("the draft server process exited")

    def _fail_pending(self, message: str) -> None:
        with self._lock:
            pending, self._pending = self._pending, deque()
        for call in pending:
            call.fail(message)
