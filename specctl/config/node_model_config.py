"""A model's config.json read through the specd of a node that loads it: a model kept on its
nodes alone (nothing at its path on the machine running `specctl`) is planned from there."""

import time
from pathlib import Path
from typing import Any

import httpx

from daemon.cluster_token import TokenError, read_token
from specctl.config.cluster import ClusterConfig
from specctl.config.schema import NodeSpec

FETCH_TIMEOUT_S = 5.0
# the TUI checks its buffer as it is edited: an answer had a moment ago is not asked again (a
# node that did not answer, for less long: it may be starting)
CACHE_TTL_S = 30.0
FAILURE_TTL_S = 10.0
_cache: dict[tuple[str, str], tuple[float, "dict[str, Any] | NodeConfigError"]] = {}


class NodeConfigError(Exception):
    """The node's specd could not give the config.json; the message says why."""


def loading_nodes(config: ClusterConfig, model: str) -> list[NodeSpec]:
    """The specd nodes of the deployment that load `model`, in the file's order."""
    deployment = config.deployment
    names: list[str] = []
    if deployment.verifier.model == model:
        names += deployment.verifier.nodes
    if not deployment.drafter.is_ngram and deployment.drafter.model == model:
        names.append(str(deployment.drafter.node))
    return [n for n in config.nodes if n.name in names and not n.is_local]


def fetch_model_config(config: ClusterConfig, node: NodeSpec, path: Path) -> dict[str, Any]:
    """GET /v1/model-config from the node's specd; NodeConfigError says why it could not."""
    address, token_file = str(node.specd), config.token_path(node)
    key = (address, str(path))
    cached = _cache.get(key)
    if cached is not None:
        at, answer = cached
        if isinstance(answer, NodeConfigError):
            if time.monotonic() - at < FAILURE_TTL_S:
                raise answer
        elif time.monotonic() - at < CACHE_TTL_S:
            return answer
    try:
        raw = _fetch(address, token_file, path)
    except NodeConfigError as error:
        _cache[key] = (time.monotonic(), error)
        raise
    _cache[key] = (time.monotonic(), raw)
    return raw


def _fetch(address: str, token_file: Path, path: Path) -> dict[str, Any]:
    try:
        token = read_token(token_file)
    except TokenError as error:
        raise NodeConfigError(str(error)) from None
    url = f"http://{address}/v1/model-config"
    try:
        response = httpx.get(
            url,
            params={"path": str(path)},
            headers={"Authorization": f"Bearer {token}"},
            timeout=FETCH_TIMEOUT_S,
        )
    except httpx.TimeoutException:
        raise NodeConfigError(f"no answer within {FETCH_TIMEOUT_S:g} s") from None
    except httpx.HTTPError as error:
        raise NodeConfigError(f"unreachable ({type(error).__name__}: {error})") from None
    try:
        body = response.json()
    except ValueError:
        raise NodeConfigError(f"HTTP {response.status_code}, not JSON (is this a specd?)") from None
    if response.status_code == 401:
        raise NodeConfigError("specd refused the cluster token (is it the same on both ends?)")
    if response.status_code != 200 or not isinstance(body.get("config"), dict):
        said = body.get("error") if isinstance(body, dict) else None
        raise NodeConfigError(str(said or f"HTTP {response.status_code}: {response.text[:200]}"))
    return body["config"]
