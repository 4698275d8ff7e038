"""Request bodies bounded in size and arrival time: a real uvicorn server on loopback, with the
app `specctl serve` builds (its backend still loading: the body limit comes before any of it)
and a bare ASGI app behind the same middleware for what happens after a body is in."""

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from starlette.responses import PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from daemon.specd.body_limit import BodyLimitMiddleware
from specctl.server.app import AppOptions, create_app
from specctl.server.backend import EngineBackend
from tests.ports import free_port

MAX_BYTES = 1000
READ_TIMEOUT_S = 0.5


class _Served:
    def __init__(self, app: object) -> None:
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_config=None)  # type: ignore[arg-type]
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10.0
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10.0)
        assert not self.thread.is_alive()


@pytest.fixture(scope="module")
def served() -> Iterator[_Served]:
    loading = threading.Event()

    def loader() -> EngineBackend:  # still loading for as long as the tests run
        loading.wait(60.0)
        raise RuntimeError("the test is over")

    app = create_app(
        loader, AppOptions("m", max_body_bytes=MAX_BYTES, body_read_timeout_s=READ_TIMEOUT_S)
    )
    server = _Served(app)
    try:
        yield server
    finally:
        loading.set()
        server.close()


def _error(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_a_body_announced_too_large_is_refused_unread(served: _Served) -> None:
    response = httpx.post(f"{served.url}/v1/completions", content=b"x" * (MAX_BYTES + 1))
    error = _error(response, 413)
    assert error["code"] == "request_too_large"
    assert f"at most {MAX_BYTES} bytes" in str(error["message"])


def test_a_chunked_body_is_refused_once_it_passes_the_limit(served: _Served) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: Transfer-Encoding: chunked
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"y" * 200
        yield b'"}'

    response = httpx.post(f"{served.url}/v1/completions", content=chunks())
    error = _error(response, 413)
    assert "bytes or more" in str(error["message"])


def test_a_body_that_stops_arriving_gets_a_408(served: _Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=10.0) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n" + b'{"prompt": "'
        )
        started = time.monotonic()
        answer = sock.recv(65536)
        waited = time.monotonic() - started
        while b"did not arrive" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
        assert sock.recv(65536) == b""  # then the connection is closed (uvicorn: ~5 s later)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"did not arrive within 0.5 s" in answer
    assert READ_TIMEOUT_S * 0.8 < waited < READ_TIMEOUT_S + 2.0


def test_a_body_within_the_limits_reaches_the_app(served: _Served) -> None:
    response = httpx.post(f"{served.url}/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    assert _error(response, 503)["code"] == "not_ready"  # read, validated, then: loading
    assert response.headers["retry-after"] == "5"
    bad = httpx.post(f"{served.url}/v1/completions", json={"prompt": "hi", "max_tokens": 0})
    assert _error(bad, 400)["param"] == "max_tokens"


async def _waits_past_the_timeout(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads its body, then waits for a disconnect three read timeouts long (as a streaming
    response listens for one): none of that wait is the body's."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    try:
        await asyncio.wait_for(receive(), 3 * READ_TIMEOUT_S)
        outcome = b"disconnected"
    except TimeoutError:
        outcome = b"waited"
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": outcome + b" %d" % len(body)})


def test_after_the_body_receive_waits_as_long_as_the_app_likes() -> None:
    def refuse(status: int, message: str) -> Response:
        return PlainTextResponse(message, status_code=status)

    app = BodyLimitMiddleware(_waits_past_the_timeout, refuse, MAX_BYTES, READ_TIMEOUT_S)
    server = _Served(app)
    try:
        response = httpx.post(server.url, content=b"z" * 10, timeout=10.0)
    finally:
        server.close()
    assert response.status_code == 200 and response.text == "waited 10"


def test_a_body_trickling_in_gets_a_408_at_the_whole_body_deadline(served: _Served) -> None:
    """A byte every 0.2 s (a read timeout of 0.5 s per chunk would never fire)."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=10.0) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        started = time.monotonic()
        sock.settimeout(0.2)
        answer = b""
        while not answer and time.monotonic() - started < 5.0:
            try:
                answer = sock.recv(65536)
            except TimeoutError:
                sock.sendall(b" ")
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert waited < READ_TIMEOUT_S + 1.0
