"""`specctl serve`: the OpenAI-compatible endpoint over the speculative engine on this machine.

The socket is bound first (a taken port is a clear error at once), the server starts answering
(`/health` 503 while loading), the models load in a thread with a progress bar, then requests
are served until SIGINT or SIGTERM. Shutdown is graceful within a bound: no new connections,
requests in flight get `--graceful-timeout-s` to finish, then the rest are aborted, the engine
stops, and the process exits 0.
"""

import asyncio
import logging
import math
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import torch
import uvicorn
from fastapi import FastAPI
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

from daemon.runtime.engine.builder import EngineSpec
from daemon.runtime.engine.loop import DEFAULT_MAX_WAITING
from daemon.runtime.errors import ModelLoadError, RequestError
from daemon.specd.header_timeout import header_timeout_protocol
from specctl.commands.generate import speculation_config
from specctl.console import make_console
from specctl.server.app import AppOptions, BackendLoader, ServingState, create_app
from specctl.server.auth import ApiKeyFileError, read_api_key_file
from specctl.server.frontend import ServingObserver
from specctl.server.local_backend import LocalBackend
from specctl.server.serve_log import StatsLogger
from specctl.server.snapshot import SnapshotListener

logger = logging.getLogger("specctl.serve")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_GRACEFUL_TIMEOUT_S = 10.0
UVICORN_BACKSTOP_S = 5  # past the drain: uvicorn cancels what is left
MAX_CONNECTIONS = 2048  # open connections (uvicorn's limit_concurrency): _make_server
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class ServeError(RequestError):
    """Bad options or environment for `specctl serve`; the message says what to change."""


@dataclass(slots=True)
class ServeOptions:
    target: Path | None = None  # None: --deployment names what to serve
    draft: Path | None = None
    ngram: bool = False
    num_speculative_tokens: int | None = None
    adaptive: bool = False
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key_file: Path | None = None
    served_model_name: str | None = None
    max_batch_size: int = 16
    prefill_chunk_tokens: int | None = None  # None: whole prompts at admission
    max_waiting: int = DEFAULT_MAX_WAITING
    max_model_len: int | None = None
    dtype: str = "auto"
    backend: str = "auto"
    graceful_timeout_s: float = DEFAULT_GRACEFUL_TIMEOUT_S
    log_level: str = "info"
    threads: int | None = None  # torch intra-op threads (CPU); None: torch's default
    deployment: Path | None = None  # an applied deployment's state.json (serve its shards)

    @property
    def model_name(self) -> str:
        return self.served_model_name or str(self.target)  # vLLM's default: the path given


def engine_spec(opts: ServeOptions) -> EngineSpec:
    if opts.prefill_chunk_tokens is not None and opts.prefill_chunk_tokens < 1:
        raise ServeError(f"--prefill-chunk-tokens must be >= 1, got {opts.prefill_chunk_tokens}")
    config = speculation_config(
        draft=opts.draft,
        ngram=opts.ngram,
        num_speculative_tokens=opts.num_speculative_tokens,
        adaptive=opts.adaptive,
        max_batch_size=opts.max_batch_size,
        prefill_chunk_tokens=opts.prefill_chunk_tokens,
    )
    assert opts.target is not None
    for flag, path in (("--target", opts.target), ("--draft", opts.draft)):
        if path is not None and not (path / "config.json").is_file():
            raise ModelLoadError(f"{flag} {path}: not a model directory (no config.json)")
    if opts.max_waiting < 0:
        raise ServeError(f"--max-waiting must be >= 0, got {opts.max_waiting}")
    if opts.max_model_len is not None and opts.max_model_len < 1:  # found before the port opens
        raise ServeError(f"--max-model-len must be >= 1, got {opts.max_model_len}")
    if opts.served_model_name is not None and not opts.served_model_name.strip():
        raise ServeError("--served-model-name is empty: clients put it in `model`")
    return EngineSpec(
        target=opts.target,
        draft=opts.draft,
        ngram=opts.ngram,
        dtype=opts.dtype,
        backend=opts.backend,
        max_model_len=opts.max_model_len,
        engine=config,
    )


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything slow happens."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise ServeError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from exc


def load_with_progress(spec: EngineSpec, opts: ServeOptions) -> LocalBackend:
    """Build the engine, showing bytes of weights loaded per model."""
    start = time.perf_counter()
    columns = (TextColumn("loading {task.description}"), BarColumn(), DownloadColumn())
    with Progress(*columns, TimeElapsedColumn(), console=make_console(stderr=True)) as bar:
        tasks: dict[str, int] = {}

        def progress(name: str, done_bytes: int, total_bytes: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=total_bytes)
            bar.update(tasks[name], completed=done_bytes, total=total_bytes)

        backend = LocalBackend.load(spec, opts.model_name, opts.max_waiting, progress)
    model = backend.model
    logger.info(
        "loaded in %.1f s: proposer %s, k %d%s, max batch %d, max model len %d",
        time.perf_counter() - start,
        model.proposer,
        model.num_speculative_tokens,
        " (adaptive ceiling)" if model.adaptive else "",
        model.max_batch_size,
        model.max_model_len,
    )
    return backend


class _Server(uvicorn.Server):
    """uvicorn, draining the engine while it waits for connections to close: requests in
    flight get the grace period, then end with an error event (no task is cancelled)."""

    def __init__(self, config: uvicorn.Config, serving: ServingState, grace_s: float) -> None:
        super().__init__(config)
        self._serving = serving
        self._grace_s = grace_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        drain = asyncio.create_task(self._serving.drain(self._grace_s))
        await super().shutdown(sockets)
        try:
            await asyncio.wait_for(drain, UVICORN_BACKSTOP_S)
        except Exception:
            logger.exception("draining the engine failed")


class _Signals:
    """Records SIGINT/SIGTERM. Installed before uvicorn, which handles them itself while it
    runs and re-raises them to the previous handler (this one) after its graceful shutdown, so
    that the process can then exit 0 instead of dying of the re-raised signal."""

    def __init__(self) -> None:
        self.received: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _: FrameType | None) -> None:
        self.received.append(signum)


def run_serve(opts: ServeOptions) -> None:
    """Serve until stopped. Raises SpecError for bad options or models that cannot load."""
    if opts.deployment is not None:
        from specctl.commands.serve_deployment import run_serve_deployment

        run_serve_deployment(opts)
        return
    if opts.target is None:
        raise ServeError("give --target DIR (a model on this machine) or --deployment STATE")
    configure(opts)
    api_key = read_api_key(opts.api_key_file)
    spec = engine_spec(opts)
    serve_app(lambda: load_with_progress(spec, opts), opts, api_key)


def serve_app(
    loader: BackendLoader,
    opts: ServeOptions,
    api_key: str | None,
    listeners: Sequence[SnapshotListener] = (),
    observers: Sequence[ServingObserver] = (),
    extend: Callable[[FastAPI], None] | None = None,
    serving_problem: Callable[[], str | None] | None = None,
) -> None:
    """Bind, answer while `loader` brings the backend up, serve until SIGINT/SIGTERM.
    `serving_problem`: why the backend, up, cannot serve now (/health answers 503 then)."""
    sock = bind(opts.host, opts.port)
    signals = _Signals()
    fatal: list[str] = []
    servers: list[_Server] = []

    def on_fatal(message: str) -> None:  # the backend could not come up: shut down, exit 2
        fatal.append(message)
        for server in servers:
            server.should_exit = True

    app = create_app(
        loader,
        AppOptions(
            served_model_name=opts.model_name,
            api_key=api_key,
            snapshot_listeners=[StatsLogger(), *listeners],
            observers=list(observers),
            on_fatal=on_fatal,
            serving_problem=serving_problem,
        ),
    )
    if extend is not None:
        extend(app)
    servers.append(_make_server(app, opts))
    auth = "API key required on /v1/*" if api_key else "no API key"
    logger.info("listening on http://%s:%d (%s)", opts.host, opts.port, auth)
    servers[0].run(sockets=[sock])
    if fatal:
        raise ModelLoadError(fatal[0])
    if signals.received:
        logger.info("stopped (signal %d)", signals.received[0])


def configure(opts: ServeOptions) -> None:
    """Logging and CPU threads, after checking the options that are not the engine's."""
    if opts.log_level.upper() not in LOG_LEVELS:
        raise ServeError(f"--log-level must be one of {', '.join(LOG_LEVELS).lower()}")
    if opts.threads is not None and opts.threads < 1:
        raise ServeError(f"--threads must be >= 1, got {opts.threads}")
    if not (math.isfinite(opts.graceful_timeout_s) and opts.graceful_timeout_s >= 0):
        raise ServeError(
            f"--graceful-timeout-s must be a finite number >= 0, got {opts.graceful_timeout_s}"
        )
    if not 0 <= opts.port <= 65535:  # 0: a free port the system picks
        raise ServeError(f"--port must be in 0..65535 (0: any free port), got {opts.port}")
    logging.basicConfig(level=opts.log_level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)


def _make_server(app: FastAPI, opts: ServeOptions) -> "_Server":
    config = uvicorn.Config(
        app,
        host=opts.host,
        port=opts.port,
        log_config=None,  # our logging configuration
        access_log=False,  # one line per request comes from the request logger instead
        timeout_graceful_shutdown=int(opts.graceful_timeout_s) + UVICORN_BACKSTOP_S,
        lifespan="on",
        # connections and tasks at once; past it, 503s. Each stream holds one, so the engine's
        # batch and queue fit many times over
        limit_concurrency=MAX_CONNECTIONS,
        # h11 with a deadline for each request's headers: idle or half-sent connections are
        # closed, so that they cannot fill the cap above
        http=header_timeout_protocol(),
    )
    return _Server(config, app.state.serving, opts.graceful_timeout_s)


def read_api_key(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return read_api_key_file(path)
    except ApiKeyFileError as exc:
        raise ServeError(str(exc)) from exc
