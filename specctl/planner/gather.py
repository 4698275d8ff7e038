"""Find out what each node has: this machine for `local` nodes, specd's inventory for the
others, or what cluster.toml declares for them.

Modes: "auto" (the default of `specctl plan`) asks specd only about nodes that declare no
hardware; "probe" asks every specd node and falls back to the declaration when it cannot;
"offline" asks no one. Every request has a timeout; a node that cannot be read is planned
from its declaration, or marked unknown with the reason.
"""

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import httpx

from daemon.cluster_token import TokenError, read_token
from daemon.specd.collect import collect_inventory
from specctl.config.cluster import ClusterConfig
from specctl.config.schema import NodeSpec
from specctl.planner.facts import NodeFacts, declared_facts, facts_from_inventory

ProbeMode = Literal["auto", "probe", "offline"]
DEFAULT_PROBE_TIMEOUT_S = 3.0


class InventoryError(Exception):
    """specd could not be asked; the message says why (unreachable, token refused, ...)."""


def gather_node_facts(
    config: ClusterConfig,
    mode: ProbeMode = "auto",
    timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
    local_inventory: Callable[[str], dict[str, Any]] | None = None,
) -> dict[str, NodeFacts]:
    """Facts for every node of the config, by name. `local_inventory` reads this machine
    (default: specd's own collector: NVML GPUs, /proc/meminfo)."""
    read_local = local_inventory or (lambda name: collect_inventory(name).to_json())
    facts: dict[str, NodeFacts] = {}
    local_json: dict[str, Any] | None = None
    remote = []
    for node in config.nodes:
        if node.is_local:
            local_json = local_json or read_local(node.name)
            facts[node.name] = facts_from_inventory(node, local_json, "local", "this machine")
        else:
            remote.append(node)
    if remote:
        with ThreadPoolExecutor(max_workers=min(8, len(remote))) as pool:
            found = pool.map(lambda n: _remote_facts(config, n, mode, timeout_s), remote)
            facts.update((node.name, result) for node, result in zip(remote, found, strict=True))
    return {node.name: facts[node.name] for node in config.nodes}


def _remote_facts(
    config: ClusterConfig, node: NodeSpec, mode: ProbeMode, timeout_s: float
) -> NodeFacts:
    is_declared = node.memory_gib is not None or bool(node.gpus)
    if mode == "offline" or (mode == "auto" and is_declared):
        why = "offline" if mode == "offline" else "--probe asks it"
        return declared_facts(node, f"as declared in the cluster file (specd not asked; {why})")
    try:
        inventory = fetch_inventory(config, node, timeout_s)
    except InventoryError as error:
        fallback = "using the declared hardware" if is_declared else "nothing declared"
        return declared_facts(node, f"specd at {node.specd}: {error}; {fallback}")
    return facts_from_inventory(node, inventory, "specd", f"specd at {node.specd}")


def token_path(config: ClusterConfig, node: NodeSpec) -> Path:
    return config.token_path(node)


def read_node_tokens(config: ClusterConfig) -> tuple[dict[str, Path], list[str]]:
    """The specd nodes' token files, each read once, here, without asking anyone: token ->
    the first file holding it, and one line per file that cannot be used, naming its nodes
    ("nodes A, B: why": missing, open to others, malformed)."""
    users: dict[Path, list[str]] = {}
    for node in config.nodes:
        if not node.is_local:
            users.setdefault(token_path(config, node), []).append(node.name)
    tokens: dict[str, Path] = {}
    problems: list[str] = []
    for path, names in users.items():
        try:
            tokens.setdefault(read_token(path), path)
        except TokenError as exc:
            who = f"node {names[0]}" if len(names) == 1 else f"nodes {', '.join(names)}"
            problems.append(f"{who}: {exc}")
    return tokens, problems


def different_tokens(tokens: dict[str, Path]) -> str | None:
    """What is wrong where the specd nodes' files hold more than one token, or None."""
    if len(tokens) < 2:
        return None
    files = ", ".join(str(p) for p in tokens.values())
    return (
        f"the specd nodes' token files hold different tokens ({files}); one cluster has one token"
    )


def token_problems(config: ClusterConfig) -> list[str]:
    """Everything `apply` would refuse about the cluster's token files ([]: nothing)."""
    tokens, problems = read_node_tokens(config)
    mixed = different_tokens(tokens)
    return problems + ([mixed] if mixed else [])


def fetch_inventory(config: ClusterConfig, node: NodeSpec, timeout_s: float) -> dict[str, Any]:
    """GET /v1/inventory from the node's specd with the cluster token."""
    return fetch_inventory_at(str(node.specd), token_path(config, node), timeout_s)


def fetch_inventory_at(address: str, token_file: Path, timeout_s: float) -> dict[str, Any]:
    """GET /v1/inventory from the specd at `address` (host:port) with the token in
    `token_file`; raises InventoryError saying what went wrong."""
    try:
        token = read_token(token_file)
    except TokenError as error:
        raise InventoryError(str(error)) from None
    url = f"http://{address}/v1/inventory"
    try:
        response = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)
    except httpx.TimeoutException:
        raise InventoryError(f"no answer within {timeout_s:g} s") from None
    except httpx.HTTPError as error:
        raise InventoryError(f"unreachable ({type(error).__name__}: {error})") from None
    if response.status_code == 401:
        raise InventoryError("specd refused the cluster token (is it the same on both ends?)")
    if response.status_code != 200:
        raise InventoryError(f"HTTP {response.status_code}: {response.text[:200]}")
    try:
        body = response.json()
    except ValueError:
        raise InventoryError("the answer is not JSON (is this a specd?)") from None
    if not isinstance(body, dict) or "host" not in body:
        raise InventoryError("the answer is not a specd inventory")
    return body
