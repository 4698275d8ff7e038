"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with OpenAI's statuses.

Every failure the endpoint can answer with goes through here, so that clients (the `openai`
package among them) see the same shape whatever went wrong: a bad parameter (400, named in
`param`), a missing or wrong API key (401), an unknown model or route (404), a full queue (429),
a server that is loading or stopping (503).
"""

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
# a request field's name: OpenAI's are snake_case; pydantic's union branch tags are type names
# ("str", "list[int]", "TextPart", "function-after[...]")
_FIELD_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "bytes", "list", "dict", "tuple", "none"})


class OpenAIError(Exception):
    """An error to answer with, in OpenAI's shape."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


def error_body(message: str, type: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def invalid_param(param: str | None, message: str, code: str | None = None) -> OpenAIError:
    """400 for a request parameter that cannot be served; `message` names it too."""
    return OpenAIError(400, message, param=param, code=code)


def param_of(loc: tuple[int | str, ...]) -> str | None:
    """A pydantic error location as a request parameter: ("body", "messages", 0, "content")
    -> "messages[0].content". Union branch tags ("str", "list[int]", "TextPart") are dropped:
    {"prompt": null} was answered with param "prompt.str"."""
    parts: list[str] = []
    for item in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif _FIELD_NAME.match(item) and item not in _TYPE_NAMES:
            parts.append(f".{item}" if parts else item)
    return "".join(parts) or None


def validation_error(errors: list[dict[str, Any]]) -> OpenAIError:
    """The most specific pydantic error (the deepest location) as one 400 naming its parameter."""
    if not errors:
        return invalid_param(None, "invalid request")
    first = max(errors, key=lambda e: len(e.get("loc", ())))
    kind = first.get("type", "")
    if kind == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", "") or "JSON decode error"
        loc = tuple(first.get("loc", ()))
        if len(loc) == 2 and isinstance(loc[1], int):  # FastAPI's ("body", offset)
            reason += f", at character {loc[1]}"
        return invalid_param(None, f"the request body is not valid JSON ({reason})")
    param = param_of(tuple(first.get("loc", ())))
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if param is None:
        if kind == "missing":
            return invalid_param(None, "the request body is missing: send a JSON object")
        return invalid_param(None, f"the request body must be a JSON object ({message})")
    return invalid_param(param, f"{param}: {message}")


async def _on_openai_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OpenAIError)
    return exc.response()


async def _on_validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return validation_error(list(exc.errors())).response()


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}"
        return OpenAIError(404, message, code="not_found").response()
    if exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
        return OpenAIError(405, message, code="method_not_allowed", headers=exc.headers).response()
    if exc.status_code == 400 and (reason := _body_read_problem(exc.__cause__)):
        return invalid_param(None, reason).response()
    kind = SERVER_ERROR if exc.status_code >= 500 else INVALID_REQUEST
    return OpenAIError(exc.status_code, str(exc.detail), type=kind, headers=exc.headers).response()


def _body_read_problem(cause: BaseException | None) -> str | None:
    """What FastAPI's "There was an error parsing the body" was (it chains the cause): bytes
    that are not UTF-8, or a JSON number Python will not convert."""
    if isinstance(cause, UnicodeDecodeError):
        return f"the request body is not valid UTF-8 (byte {cause.start})"
    if isinstance(cause, ValueError):
        first = str(cause).split(":", 1)[0]
        return f"the request body is not valid JSON ({first})"
    return None


async def _on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    logger.exception("unexpected error while serving a request")
    message = f"internal error: {type(exc).__name__}: {exc}"
    return OpenAIError(500, message, type=SERVER_ERROR).response()


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(OpenAIError, _on_openai_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
