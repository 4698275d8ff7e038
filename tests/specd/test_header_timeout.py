"""A request's headers, bounded in arrival time (daemon/specd/header_timeout.py): a real
uvicorn server on loopback with the protocol `specctl serve` and specd run, over raw sockets."""

import asyncio
import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from daemon.specd.header_timeout import header_timeout_protocol
from tests.ports import free_port

TIMEOUT_S = 0.5
SLOW_ANSWER_S = 1.5  # three header deadlines: an answer this slow must still arrive whole
WAIT_S = 5.0  # a socket read's bound: past it, the server held the connection open


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    assert scope["type"] == "http"
    if scope["path"] == "/slow":
        await asyncio.sleep(SLOW_ANSWER_S)
    headers = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(
        _app, host="127.0.0.1", port=port, log_config=None, http=header_timeout_protocol(TIMEOUT_S)
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10.0
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield port
    server.should_exit = True
    thread.join(timeout=10.0)
    assert not thread.is_alive()


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    sock.settimeout(WAIT_S)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes (a socket.timeout if it does not within WAIT_S)."""
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def _closed_within(sock: socket.socket) -> float:
    start = time.monotonic()
    assert _read_all(sock) == b""  # closed without an answer
    return time.monotonic() - start


def test_a_connection_that_sends_nothing_is_closed(port: int) -> None:
    with _connect(port) as sock:
        assert TIMEOUT_S * 0.8 <= _closed_within(sock) < TIMEOUT_S + 2.0


def test_half_sent_headers_are_closed(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # no blank line: the headers never end
        assert _closed_within(sock) < TIMEOUT_S + 2.0


def test_a_byte_at_a_time_does_not_hold_the_connection(port: int) -> None:
    """The deadline is for the whole of the headers, not for each byte: a byte every
    TIMEOUT_S / 5 (which a deadline per byte would never end) is closed after about TIMEOUT_S."""
    request = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100 + b"\r\n\r\n"
    closed = False
    with _connect(port) as sock:
        start = time.monotonic()
        for byte in request:
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # reset: closed
                closed = True
                break
            time.sleep(TIMEOUT_S / 5)
            readable, _, _ = select.select([sock], [], [], 0)  # without waiting
            if readable:
                closed = sock.recv(1) == b""
                break
        assert closed, "the server answered or never closed"
        assert time.monotonic() - start < TIMEOUT_S + 2.0


def test_a_slow_answer_and_a_later_request_on_the_connection_are_served(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"ok"):
            chunk = sock.recv(4096)
            assert chunk, f"closed mid-answer after {answer!r}"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _read_all(sock).endswith(b"ok")
