"""The specd HTTP API. Handlers are thin: they call the same objects the tests drive."""

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from daemon.specd.api_models import (
    MAX_LOG_LINES,
    ErrorBody,
    RayStartRequest,
    RayStartResponse,
    RayStatus,
    RayStopResponse,
)
from daemon.specd.auth import BearerAuthMiddleware
from daemon.specd.body_limit import BodyLimitMiddleware
from daemon.specd.config import SpecdConfig
from daemon.specd.inventory import Inventory
from daemon.specd.log_tail import tail_lines
from daemon.specd.model_config import ModelConfigError, read_model_config
from daemon.specd.ray_node import RayNode, RayNodeError
from daemon.specd.ray_status import query_status

logger = logging.getLogger(__name__)

MODEL_CONFIG_THREADS = 2
MODEL_CONFIG_TIMEOUT_S = 10.0
# A start's body is a role, an address and a few labels: a few hundred bytes
MAX_BODY_BYTES = 2**20
BODY_READ_TIMEOUT_S = 30.0

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody},
    409: {"model": ErrorBody},
    422: {"model": ErrorBody},
}


def _field(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc)


async def _invalid_request(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    details = [{"field": _field(e["loc"]), "message": e["msg"]} for e in exc.errors()]
    first = details[0] if details else {"field": None, "message": "invalid request"}
    body = ErrorBody(
        error=f"invalid request: {first['field']}: {first['message']}",
        field=first["field"],
        details=details,
    )
    return JSONResponse(status_code=422, content=body.model_dump())


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    body = ErrorBody(error=str(exc.detail))
    return JSONResponse(status_code=exc.status_code, content=body.model_dump(), headers=exc.headers)


def _refuse_body(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content=ErrorBody(error=message).model_dump())


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    """Anything else (an OSError on the state directory): JSON like every other answer, the
    traceback in specd's log only (it was a plain-text 500)."""
    logger.exception("unexpected error while serving a request")
    body = ErrorBody(error=f"internal error: {type(exc).__name__}: {str(exc)[:300]}")
    return JSONResponse(status_code=500, content=body.model_dump())


async def _ray_node_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RayNodeError)
    logger.warning("ray request refused (%d): %s", exc.status_code, exc.message)
    body = ErrorBody(error=exc.message, field=exc.field)
    return JSONResponse(status_code=exc.status_code, content=body.model_dump())


async def _model_config_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ModelConfigError)
    body = ErrorBody(error=exc.message, field="path")
    return JSONResponse(status_code=exc.status_code, content=body.model_dump())


def create_app(
    config: SpecdConfig,
    token: str,
    token_file: Path,
    ray_node: RayNode,
    inventory: Callable[[], Inventory],
) -> FastAPI:
    app = FastAPI(title="specd", version="0.1.0", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BearerAuthMiddleware, token=token)
    app.add_middleware(  # outside the token check, as `specctl serve`'s is outside its key's
        BodyLimitMiddleware,
        refuse=_refuse_body,
        max_bytes=MAX_BODY_BYTES,
        read_timeout_s=BODY_READ_TIMEOUT_S,
    )
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(RayNodeError, _ray_node_error)
    app.add_exception_handler(ModelConfigError, _model_config_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)

    @app.get("/health")
    async def health() -> dict[str, str]:  # on the event loop: never behind the thread pool
        return {"status": "ok"}

    @app.get("/v1/inventory", responses=_ERRORS)
    def get_inventory() -> dict[str, Any]:
        return inventory().to_json()

    @app.post("/v1/ray/start", responses=_ERRORS)
    def ray_start(request: RayStartRequest) -> RayStartResponse:
        try:
            node, started = ray_node.start(request)
        except OSError as exc:  # the state or temp directory: said as the node's error
            logger.exception("ray start failed")
            raise RayNodeError(500, f"ray start failed here: {exc}") from None
        status = RayStatus(
            running=True, role=node.role, gcs_address=node.gcs_address, labels=node.labels
        )
        return RayStartResponse(started=started, status=status)

    @app.post("/v1/ray/stop", responses=_ERRORS)
    def ray_stop() -> RayStopResponse:
        try:
            stopped, leftover = ray_node.stop()
        except OSError as exc:
            logger.exception("ray stop failed")
            raise RayNodeError(500, f"ray stop failed here: {exc}") from None
        return RayStopResponse(stopped=stopped, leftover_pids=leftover)

    @app.get("/v1/ray/status", responses=_ERRORS)
    def ray_status() -> RayStatus:
        return query_status(config, token_file, ray_node.running)

    @app.get("/v1/logs", responses=_ERRORS)
    def logs(lines: int = Query(100, ge=1, le=MAX_LOG_LINES)) -> dict[str, list[str]]:
        return {"lines": tail_lines(config.log_file, lines)}

    # a read of a hung file system (NFS) never returns: such reads get threads of their own,
    # so that they cannot take the pool the other routes run on
    reads = anyio.CapacityLimiter(MODEL_CONFIG_THREADS)

    @app.get("/v1/model-config", responses={**_ERRORS, 404: {"model": ErrorBody}})
    async def model_config(path: str = Query(..., min_length=1)) -> dict[str, Any]:
        try:
            with anyio.fail_after(MODEL_CONFIG_TIMEOUT_S):
                config = await anyio.to_thread.run_sync(
                    read_model_config, path, limiter=reads, abandon_on_cancel=True
                )
        except TimeoutError:
            raise ModelConfigError(
                504, f"reading {path}/config.json took over {MODEL_CONFIG_TIMEOUT_S:g} s here"
            ) from None
        return {"config": config}

    return app
