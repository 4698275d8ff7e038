"""The FastAPI app: routes, the API key, error shapes, and bringing the backend up.

The app starts listening at once and loads its backend in a thread of its own, so `/health`
answers 503 `{"status": "loading"}` while models load (and `/v1/*` answers 503), then 200. A
backend that fails to come up makes `/health` answer `{"status": "failed"}` and calls
`on_fatal`, with which the serve command shuts the server down and exits non-zero.
"""

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from starlette.requests import Request as HttpRequest

from daemon.runtime.errors import SpecError
from daemon.specd.body_limit import (
    DEFAULT_BODY_READ_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    BodyLimitMiddleware,
)
from specctl.server.auth import ApiKeyMiddleware
from specctl.server.backend import EngineBackend
from specctl.server.errors import OpenAIError, install_error_handlers
from specctl.server.frontend import DEFAULT_IDLE_TIMEOUT_S, Frontend, ServingObserver
from specctl.server.handlers import create_chat_completion, create_completion
from specctl.server.loading import run_in_daemon_thread
from specctl.server.metrics import CONTENT_TYPE, ServerMetrics
from specctl.server.openai_models import ChatCompletionRequest, CompletionRequest
from specctl.server.openai_responses import ErrorResponse, ModelCard, ModelList
from specctl.server.serve_log import RequestLogger
from specctl.server.snapshot import DEFAULT_INTERVAL_S, SnapshotListener, SnapshotRecorder
from specctl.server.trailing_slash import TrailingSlashMiddleware

logger = logging.getLogger("specctl.serve")

BackendLoader = Callable[[], EngineBackend]


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorResponse} for status in statuses}


GENERATION_ERRORS = _errors(400, 401, 404, 429, 500, 503)
DRAIN_POLL_S = 0.05
LOADING_RETRY_AFTER_S = 5  # the Retry-After of a 503 while the model loads
MAX_WARNED_FIELDS = 256  # unknown field names remembered (each logged once)
MAX_WARNED_NAMES = 8  # ... shown in one log line
MAX_FIELD_NAME_SHOWN = 64  # characters of a name shown


@dataclass(slots=True)
class AppOptions:
    served_model_name: str
    api_key: str | None = None  # None: /v1/* is open
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    snapshot_interval_s: float = DEFAULT_INTERVAL_S
    snapshot_listeners: list[SnapshotListener] = field(default_factory=list)
    observers: list[ServingObserver] = field(default_factory=list)  # told of every request
    on_fatal: Callable[[str], None] | None = None  # the backend could not come up
    # why the backend, up, cannot serve now (a deployment's verifier failed): /health's 503
    serving_problem: Callable[[], str | None] | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger request bodies get a 413
    body_read_timeout_s: float = DEFAULT_BODY_READ_TIMEOUT_S  # a body slower gets a 408


class ServingState:
    """What the routes share: readiness, the frontend once up, metrics and snapshots."""

    def __init__(self, options: AppOptions) -> None:
        self.options = options
        self.status = "loading"  # loading | ready | failed | stopping
        self.failure: str | None = None
        self.frontend: Frontend | None = None
        self.metrics = ServerMetrics(options.served_model_name)
        self.snapshots = SnapshotRecorder(options.snapshot_interval_s)
        for listener in options.snapshot_listeners:
            self.snapshots.add_listener(listener)
        self.created = int(time.time())
        self._warned_fields: set[str] = set()  # at most MAX_WARNED_FIELDS names

    def ready_frontend(self) -> Frontend:
        if self.frontend is None or self.status != "ready":
            why = {"loading": "the model is still loading", "stopping": "the server is stopping"}
            message = why.get(self.status, f"the engine failed: {self.failure}")
            # a loading server will answer: when to try again (a stopping or failed one won't)
            headers = (
                {"Retry-After": str(LOADING_RETRY_AFTER_S)} if self.status == "loading" else None
            )
            raise OpenAIError(503, message, type="server_error", code="not_ready", headers=headers)
        return self.frontend

    async def bring_up(self, loader: BackendLoader) -> None:
        try:
            backend = await run_in_daemon_thread(loader, name="model-loader")
            observers = [self.metrics, self.snapshots, RequestLogger(), *self.options.observers]
            frontend = Frontend(backend, observers, idle_timeout_s=self.options.idle_timeout_s)
            await frontend.start()
        except Exception as exc:
            if not isinstance(exc, SpecError):
                logger.exception("the engine backend failed to start")
            self.status, self.failure = "failed", str(exc)
            if self.options.on_fatal is not None:
                self.options.on_fatal(str(exc))
            return
        self.frontend = frontend
        if self.status == "loading":
            self.status = "ready"
            logger.info("ready: serving %r", backend.model.name)

    async def drain(self, grace_s: float) -> None:
        """Take no more requests; give those in flight `grace_s` to finish, then end them (a
        stream gets an error event and `[DONE]`, a waiting client a 503)."""
        self.status = "stopping"
        frontend = self.frontend
        if frontend is None:
            return
        deadline = time.monotonic() + grace_s
        while frontend.num_open_requests and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        if frontend.num_open_requests:
            logger.info("ending %d requests still in flight", frontend.num_open_requests)
        await frontend.stop()

    async def tick_snapshots(self) -> None:
        while True:
            await asyncio.sleep(self.snapshots.interval_s)
            self.snapshots.tick()

    def warn_ignored(self, fields: list[str]) -> None:
        """Log unknown fields once each. The names are the client's: shown with repr (a name
        holding a newline and a log line's start forged a line in the log), at most
        MAX_WARNED_NAMES a request, and at most MAX_WARNED_FIELDS remembered (a client
        sending new names with every request grew the set and the log without end)."""
        if len(self._warned_fields) >= MAX_WARNED_FIELDS:
            return
        new = [f for f in dict.fromkeys(fields) if f not in self._warned_fields]
        new = new[: MAX_WARNED_FIELDS - len(self._warned_fields)]
        if new:
            self._warned_fields.update(new)
            shown = ", ".join(repr(f[:MAX_FIELD_NAME_SHOWN]) for f in new[:MAX_WARNED_NAMES])
            more = f" and {len(new) - MAX_WARNED_NAMES} more" if len(new) > MAX_WARNED_NAMES else ""
            logger.warning("ignoring unknown request fields (told once): %s%s", shown, more)
            if len(self._warned_fields) >= MAX_WARNED_FIELDS:
                logger.warning(
                    "%d unknown field names told; no more will be", len(self._warned_fields)
                )


def create_app(loader: BackendLoader, options: AppOptions) -> FastAPI:
    state = ServingState(options)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        tasks = [
            asyncio.create_task(state.bring_up(loader)),
            asyncio.create_task(state.tick_snapshots()),
        ]
        yield
        state.status = "stopping"
        for task in tasks:
            task.cancel()
        if state.frontend is not None:
            await state.frontend.stop()

    app = FastAPI(title="specctl", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.serving = state
    if options.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=options.api_key)
    app.add_middleware(  # outside the key's: a body is bounded before it is even looked at
        BodyLimitMiddleware,
        refuse=_refuse_body,
        max_bytes=options.max_body_bytes,
        read_timeout_s=options.body_read_timeout_s,
    )
    app.add_middleware(TrailingSlashMiddleware)  # outermost: every layer sees the path served
    install_error_handlers(app)
    _add_routes(app, state)
    _document_errors(app)
    return app


def _refuse_body(status: int, message: str) -> Response:
    """A body refused before the app runs (too large, by its Content-Length), OpenAI's way."""
    return OpenAIError(status, message, code="request_too_large").response()


def _document_errors(app: FastAPI) -> None:
    """The OpenAPI schema as served: errors in OpenAI's shape with OpenAI's statuses (400 for
    a bad body, not FastAPI's 422)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for operations in schema["paths"].values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _add_routes(app: FastAPI, state: ServingState) -> None:
    @app.get("/health")
    async def health() -> Response:
        # the pid tells whoever started this process that the answer is its own, not another
        # program's on the same port (apply took one for a server that had failed to bind)
        body: dict[str, Any] = {"status": state.status, "pid": os.getpid()}
        if state.failure:
            body["error"] = state.failure
        check = state.options.serving_problem
        if state.status == "ready" and check is not None and (problem := check()):
            # up, but every request would fail: a load balancer must not send it any
            body.update(status="degraded", error=problem)
            return JSONResponse(body, status_code=503)
        return JSONResponse(body, status_code=200 if state.status == "ready" else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/v1/models", responses=_errors(401, 503))
    async def list_models() -> ModelList:
        return ModelList(data=[_card(state)])

    @app.get("/v1/models/{model_id:path}", responses=_errors(401, 404, 503))
    async def get_model(model_id: str) -> ModelCard:
        card = _card(state)
        if model_id != card.id:
            raise OpenAIError(
                404, f"the model {model_id!r} does not exist", param="model", code="model_not_found"
            )
        return card

    @app.post("/v1/completions", responses=GENERATION_ERRORS)
    async def completions(body: CompletionRequest, http: HttpRequest) -> Response:
        frontend = state.ready_frontend()
        state.warn_ignored(body.ignored_fields)
        return await create_completion(body, http, frontend)

    @app.post("/v1/chat/completions", responses=GENERATION_ERRORS)
    async def chat_completions(body: ChatCompletionRequest, http: HttpRequest) -> Response:
        frontend = state.ready_frontend()
        state.warn_ignored(body.ignored_fields)
        return await create_chat_completion(body, http, frontend)


def _card(state: ServingState) -> ModelCard:
    model = state.ready_frontend().backend.model
    return ModelCard(
        id=model.name, created=state.created, root=model.name, max_model_len=model.max_model_len
    )
