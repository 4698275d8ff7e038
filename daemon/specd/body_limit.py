"""A request body's size and arrival time, bounded (ASGI middleware, outside the key check).

Without a bound, a 30 MB prompt was parsed and tokenised while every other client waited: a
/health sent meanwhile took 34 s, and the process grew by ~4 GB. And a client that announced a
body and sent part of it held its connection for as long as it liked. Bodies larger than
`max_bytes` are refused with a 413 (from Content-Length before any byte is read, or once the
bytes read pass it), and a body not complete within `read_timeout_s` gets a 408.

`specctl serve` and specd both run it, each answering in its own error shape: `refuse` makes
the response of a refusal before the app runs; one while the app reads the body is raised as
an HTTPException, which the app's own error handlers render.
"""

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# (status, message) -> the response that says so, in the server's error shape
Refuse = Callable[[int, str], Response]

DEFAULT_MAX_BODY_BYTES = 16 * 2**20  # a 128k-token prompt is ~0.5-1 MB of JSON
DEFAULT_BODY_READ_TIMEOUT_S = 30.0


class BodyLimitMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        refuse: Refuse,
        max_bytes: int = DEFAULT_MAX_BODY_BYTES,
        read_timeout_s: float = DEFAULT_BODY_READ_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.refuse = refuse
        self.max_bytes = max_bytes
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        announced = _content_length(scope)
        if announced is not None and announced > self.max_bytes:
            await self.refuse(413, self._too_large(announced))(scope, receive, send)
            return
        read = 0
        complete = False
        deadline: float | None = None  # the whole body's, from the app's first read

        async def bounded_receive() -> Message:
            nonlocal read, complete, deadline
            if complete:  # the body is in: what comes now is a disconnect, whenever it comes
                return await receive()
            now = asyncio.get_running_loop().time()
            if deadline is None:
                deadline = now + self.read_timeout_s
            try:  # a timeout per chunk let a byte every 29 s hold the connection for ever
                async with asyncio.timeout_at(deadline):  # (wait_for could lose a cancel)
                    message = await receive()
            except TimeoutError:
                # raised through FastAPI's body reading, which passes HTTPException on, to the
                # error handlers: an OpenAI-shaped 408
                raise HTTPException(
                    408, f"the request body did not arrive within {self.read_timeout_s:g} s"
                ) from None
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > self.max_bytes:
                    raise HTTPException(413, self._too_large(read))
                complete = not message.get("more_body", False)
            else:
                complete = True
            return message

        await self.app(scope, bounded_receive, send)

    def _too_large(self, size: int) -> str:
        return (
            f"the request body is {size} bytes or more; this server takes at most "
            f"{self.max_bytes} bytes"
        )


def _content_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
