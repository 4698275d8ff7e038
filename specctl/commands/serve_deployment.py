"""`specctl serve --deployment STATE`: the serving process `specctl apply` starts.

It reads the deployment `apply` recorded (`state.json`), listens where the cluster file's
`[server]` asked, joins the deployment's Ray cluster, puts every replica's verifier shard
behind the endpoint, writes the metrics history to the deployment's SQLite store (the one
writer), and answers `/specctl/status` with the shards it watches (role, planned node, the
node each reports running on, its state) and the last second's figures, for `specctl status`
and the TUI.
"""

import dataclasses
import logging
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from daemon.runtime.errors import ModelLoadError
from db.errors import StoreError
from specctl.apply.state import AppliedState
from specctl.commands.serve import ServeError, ServeOptions, configure, read_api_key, serve_app
from specctl.deploy.deployment_backend import (
    DeploymentError,
    ShardWatcher,
    connect_deployment,
    deployment_backend,
    read_deployment,
)
from specctl.deploy.ray_connect import RayConnectError
from specctl.server.app import ServingState
from specctl.server.backend import EngineBackend
from specctl.server.history import HistoryRecorder
from specctl.server.node_sampler import NodeSampler

logger = logging.getLogger("specctl.serve")

STATUS_ROUTE = "/specctl/status"


def run_serve_deployment(opts: ServeOptions) -> None:
    assert opts.deployment is not None
    if opts.target is not None:
        raise ServeError("--deployment serves the applied shards; drop --target")
    given = [
        flag
        for flag, value in (
            ("--draft", opts.draft),
            ("--ngram", opts.ngram or None),
            ("--num-speculative-tokens", opts.num_speculative_tokens),
            ("--adaptive", opts.adaptive or None),
            ("--max-model-len", opts.max_model_len),
            ("--prefill-chunk-tokens", opts.prefill_chunk_tokens),
        )
        if value is not None
    ]
    if given:  # the shards run as applied: these would change nothing, silently
        raise ServeError(
            f"{', '.join(given)}: the deployment's shards run as its cluster file says; "
            "set these there (under [deployment] or [server]) and apply it"
        )
    try:
        state = read_deployment(opts.deployment)
    except DeploymentError as exc:
        raise ServeError(str(exc)) from None
    if state.server is None:
        raise ServeError(f"{opts.deployment}: the deployment has no [server] section recorded")
    opts = dataclasses.replace(
        opts,
        host=state.server.host,
        port=state.server.port,
        served_model_name=state.served_model_name,
        max_batch_size=state.server.max_batch_size,
    )
    configure(opts)
    api_key_file = Path(state.server.api_key_file) if state.server.api_key_file else None
    api_key = read_api_key(api_key_file)
    history = _history(state)
    watcher = ShardWatcher(state)

    def load() -> EngineBackend:
        try:
            connect_deployment(state)
            backend = deployment_backend(state)
        except (DeploymentError, RayConnectError) as exc:
            raise ModelLoadError(str(exc)) from None
        watcher.start()
        return backend

    def extend(app: FastAPI) -> None:
        serving: ServingState = app.state.serving

        @app.get(STATUS_ROUTE, include_in_schema=False)
        def status() -> dict[str, Any]:
            return _status(state, serving, watcher)

    listeners = [history] if history else []
    nodes = NodeSampler(state.nodes, history.writer) if history else None
    if history and nodes:
        history.start()
        nodes.start()
    try:
        serve_app(load, opts, api_key, listeners, listeners, extend, watcher.serving_problem)
    finally:
        watcher.stop()
        if nodes:
            nodes.stop()
        if history:
            history.stop()


def _history(state: AppliedState) -> HistoryRecorder | None:
    if not state.db_path or not state.deployment_id:
        logger.warning("no metrics store recorded for this deployment: history not written")
        return None
    try:
        return HistoryRecorder(Path(state.db_path), state.deployment_id)
    except StoreError as exc:
        logger.warning("metrics history not written: %s", exc)
        return None


def _status(state: AppliedState, serving: ServingState, watcher: ShardWatcher) -> dict[str, Any]:
    latest = serving.snapshots.latest
    return {
        "deployment": state.deployment,
        "deployment_id": state.deployment_id,
        "served_model_name": state.served_model_name,
        "status": serving.status,
        "failure": serving.failure,
        "shards": watcher.reports(),
        "metrics": dataclasses.asdict(latest) if latest is not None else None,
    }
