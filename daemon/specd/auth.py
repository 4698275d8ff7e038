"""Bearer-token authentication for every route but /health, as ASGI middleware so that it runs
before any body is read or validated: an unauthenticated caller learns nothing, not even
whether its body would have parsed or whether a route exists."""

import hashlib
import hmac
import json
import logging

from starlette.types import ASGIApp, Receive, Scope, Send

logger = logging.getLogger(__name__)

PUBLIC_PATHS = frozenset({"/health"})
MAX_LOGGED_PATH = 200  # characters of a refused request's path in the log
_BEARER = "bearer "


def _digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


def token_matches(presented: bytes, expected_digest: bytes) -> bool:
    """Constant-time comparison; hashing first keeps the time independent of the length too."""
    return hmac.compare_digest(_digest(presented), expected_digest)


def _presented_token(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            text = value.decode("latin-1")
            if text[: len(_BEARER)].lower() != _BEARER:
                return None
            return value[len(_BEARER) :].strip()
    return None


class BearerAuthMiddleware:
    def __init__(self, app: ASGIApp, token: str) -> None:
        self._app = app
        self._expected_digest = _digest(token.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self._app(scope, receive, send)
            return
        presented = _presented_token(scope)
        if presented is not None and token_matches(presented, self._expected_digest):
            await self._app(scope, receive, send)
            return
        client = scope.get("client") or ("unknown", 0)
        reason = "missing" if presented is None else "wrong"
        logger.warning(  # the path is the caller's: repr'd (a newline forged a log line) and cut
            "rejected %s %r from %s: %s bearer token",
            scope["method"],
            scope["path"][:MAX_LOGGED_PATH],
            client[0],
            reason,
        )
        await _send_401(send, f"{reason} bearer token: send 'Authorization: Bearer <token>'")


async def _send_401(send: Send, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b'Bearer realm="specd"'),
    ]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})
