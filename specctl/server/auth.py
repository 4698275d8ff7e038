"""The optional API key: read from a private file, checked on every /v1/* request.

`/health` and `/metrics` stay open so that load balancers and Prometheus need no key (they
reveal no prompt or output). The key is compared in constant time (of its SHA-256, so that the
time does not depend on the length either), before any body is read or validated: a caller
without the key learns nothing, not even whether its body would have parsed.
"""

import hashlib
import hmac
import json
import logging
import stat
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from specctl.server.errors import error_body

logger = logging.getLogger(__name__)

PROTECTED_PREFIX = "/v1/"
_BEARER = "bearer "


class ApiKeyFileError(ValueError):
    """The API key file cannot be used; the message says why and what to do."""


def read_api_key_file(path: Path) -> str:
    """The key in `path`: refuse a missing, empty, or group/other-readable file."""
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except OSError as exc:
        raise ApiKeyFileError(f"--api-key-file {path}: cannot read ({exc.strerror})") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ApiKeyFileError(
            f"--api-key-file {path}: readable by others (mode {stat.S_IMODE(mode):04o}); "
            f"run: chmod 600 {path}"
        )
    key = text.strip()
    if not key:
        raise ApiKeyFileError(f"--api-key-file {path}: the file is empty")
    if any(c.isspace() for c in key) or not key.isprintable():
        raise ApiKeyFileError(
            f"--api-key-file {path}: the key must be one line of printable characters "
            "without spaces"
        )
    return key


def _digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


def _presented_key(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            if value[: len(_BEARER)].decode("latin-1").lower() != _BEARER:
                return None
            return value[len(_BEARER) :].strip()
    return None


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self._app = app
        self._expected = _digest(api_key.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PROTECTED_PREFIX):
            await self._app(scope, receive, send)
            return
        presented = _presented_key(scope)
        if presented is not None and hmac.compare_digest(_digest(presented), self._expected):
            await self._app(scope, receive, send)
            return
        reason = "missing" if presented is None else "incorrect"
        client = (scope.get("client") or ("unknown", 0))[0]
        logger.warning(
            "refused %s %s from %s: %s API key", scope["method"], scope["path"], client, reason
        )
        message = f"{reason} API key: send 'Authorization: Bearer <key>'"
        await _send_401(send, message)


async def _send_401(send: Send, message: str) -> None:
    body = json.dumps(error_body(message, "invalid_request_error", None, "invalid_api_key"))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b'Bearer realm="specctl"'),
    ]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body.encode()})
