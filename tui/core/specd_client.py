"""Asking one node's specd for JSON (`/v1/ray/status`, `/v1/logs`) with the cluster token.

Every failure becomes a `SpecdProblem` whose message says what went wrong in the words the
Nodes and Logs screens show: unreachable, no answer in time, token refused, not a specd.
The inventory itself comes from the planner's `fetch_inventory`, which words its errors alike.
"""

from typing import Any

import httpx

from daemon.cluster_token import TokenError, read_token
from specctl.config.cluster import ClusterConfig
from specctl.config.schema import NodeSpec
from specctl.planner.gather import token_path


class SpecdProblem(Exception):
    """specd could not be asked, or refused; str() says why in one line."""


def get_specd_json(
    config: ClusterConfig,
    node: NodeSpec,
    path: str,
    timeout_s: float,
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """GET `path` from the node's specd; the decoded JSON object, or SpecdProblem."""
    try:
        token = read_token(token_path(config, node))
    except TokenError as error:
        raise SpecdProblem(str(error)) from None
    url = f"http://{node.specd}{path}"
    headers = {"Authorization": f"Bearer {token}"}
    try:
        response = httpx.get(url, headers=headers, params=params, timeout=timeout_s)
    except httpx.TimeoutException:
        raise SpecdProblem(f"no answer from {node.specd} within {timeout_s:g} s") from None
    except httpx.HTTPError as error:
        raise SpecdProblem(f"{node.specd} unreachable ({type(error).__name__})") from None
    if response.status_code == 401:
        raise SpecdProblem(f"specd at {node.specd} refused the cluster token (wrong token?)")
    if response.status_code != 200:
        raise SpecdProblem(f"specd at {node.specd}: HTTP {response.status_code}")
    try:
        body = response.json()
    except ValueError:
        raise SpecdProblem(f"{node.specd} answered, but not with JSON (is it specd?)") from None
    if not isinstance(body, dict):
        raise SpecdProblem(f"{node.specd} answered with something other than a JSON object")
    return body
