"""A model's config.json read through the specd of a node that loads it: a model kept on its
nodes alone (nothing at its path on the machine running `specctl`) is planned from there."""

import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from daemon.cluster_token import TokenError, read_token
from specctl.config.cluster import ClusterConfig
from specctl.config.schema import NodeSpec

FETCH_TIMEOUT_S = 5.0  # all of a model's nodes asked at once, answers awaited this long
# the TUI checks its buffer as it is edited: an answer had a moment ago is not asked again (a
# node that did not answer, for less long: it may be starting)
CACHE_TTL_S = 30.0
FAILURE_TTL_S = 10.0
# a failure kept as (message, unreachable): not the exception, whose traceback holds frames
_cache: dict[tuple[str, str, str], tuple[float, dict[str, Any] | tuple[str, bool]]] = {}
_cache_lock = threading.Lock()


class NodeConfigError(Exception):
    """The node's specd could not give the config.json; the message says why. `unreachable`:
    no specd answered (down, no route, a timeout, a proxy's or the server's own error), as
    against one that answered no (no such directory, the token refused)."""

    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


def loading_nodes(config: ClusterConfig, model: str) -> list[NodeSpec]:
    """The nodes of the deployment that load `model`, in the file's order."""
    deployment = config.deployment
    names: list[str] = []
    if deployment.verifier.model == model:
        names += deployment.verifier.nodes
    if not deployment.drafter.is_ngram and deployment.drafter.model == model:
        names.append(str(deployment.drafter.node))
    return [n for n in config.nodes if n.name in names]


def first_config(
    config: ClusterConfig, nodes: list[NodeSpec], path: Path, timeout_s: float
) -> tuple[NodeSpec | None, dict[str, Any] | None, list[str], bool]:
    """Ask every node's specd at once for `path`/config.json: the first that gave it (node,
    parsed JSON), or (None, None) and what each node said ("node X: why"); last, whether no
    node answered at all (every one down or silent: the model may well be there)."""
    pool = ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="model-config")
    futures: dict[Future[dict[str, Any]], NodeSpec] = {
        pool.submit(_cached_fetch, config, node, path, timeout_s): node for node in nodes
    }
    said: dict[str, str] = {}
    answered = False
    deadline = time.monotonic() + timeout_s
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(
                pending, timeout=max(0.0, deadline - time.monotonic()), return_when=FIRST_COMPLETED
            )
            if not done:
                break
            for future in done:
                node = futures[future]
                try:
                    return node, future.result(), [], False
                except NodeConfigError as error:
                    said[node.name] = str(error)
                    answered |= not error.unreachable
        for future in pending:  # a DNS lookup httpx cannot bound, say: not waited for
            said[futures[future].name] = f"no answer within {timeout_s:g} s"
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    answers = [f"node {n.name}: {said[n.name]}" for n in nodes if n.name in said]
    return None, None, answers, not answered


def _cached_fetch(
    config: ClusterConfig, node: NodeSpec, path: Path, timeout_s: float
) -> dict[str, Any]:
    address, token_file = str(node.specd), config.token_path(node)
    key = (address, str(token_file), str(path))
    with _cache_lock:
        cached = _cache.get(key)
    if cached is not None:
        at, answer = cached
        if isinstance(answer, tuple):
            if time.monotonic() - at < FAILURE_TTL_S:
                raise NodeConfigError(*answer)
        elif time.monotonic() - at < CACHE_TTL_S:
            return answer
    try:
        raw = _fetch(address, token_file, path, timeout_s)
    except NodeConfigError as error:
        with _cache_lock:
            _cache[key] = (time.monotonic(), (str(error), error.unreachable))
        raise
    with _cache_lock:
        _cache[key] = (time.monotonic(), raw)
    return raw


def _fetch(address: str, token_file: Path, path: Path, timeout_s: float) -> dict[str, Any]:
    """GET /v1/model-config from the specd at `address`; NodeConfigError says why not."""
    import httpx  # the config package stays light to import (the TUI loads it at start)

    try:
        token = read_token(token_file)
    except TokenError as error:
        raise NodeConfigError(f"cannot ask its specd: {error}") from None
    try:
        response = httpx.get(
            f"http://{address}/v1/model-config",
            params={"path": str(path)},
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
        )
    except httpx.TimeoutException:
        raise NodeConfigError(
            f"specd at {address}: no answer within {timeout_s:g} s", unreachable=True
        ) from None
    except httpx.HTTPError as error:
        raise NodeConfigError(
            f"specd at {address} unreachable ({type(error).__name__}: {error})", unreachable=True
        ) from None
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):  # a proxy's page, say: the specd was not reached
        raise NodeConfigError(
            f"specd at {address}: HTTP {response.status_code}, not a specd's answer",
            unreachable=True,
        )
    if response.status_code == 401:
        raise NodeConfigError(
            f"specd at {address} refused the cluster token (is it the same on both ends?)"
        )
    if response.status_code == 404 and body.get("field") != "path":
        raise NodeConfigError(
            f"specd at {address} has no /v1/model-config (an older specd): upgrade it there"
        )
    config = body.get("config")
    if response.status_code != 200 or not isinstance(config, dict):
        said = body.get("error") or f"HTTP {response.status_code}"
        # a server error (its own read timed out, say) says nothing of the file
        raise NodeConfigError(f"specd at {address}: {said}", response.status_code >= 500)
    return config
