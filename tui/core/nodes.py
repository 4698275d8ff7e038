"""What the Nodes screen shows for each node of the cluster file: reachability, CPUs and
memory, every GPU with memory, utilisation and temperature, and the node's Ray state.

`local` nodes are read on this machine (specd's own collector); the others through their
specd (`/v1/inventory`, `/v1/ray/status`) with the cluster token. Nothing here raises for a
node that cannot be read: the status says why instead (unreachable, token refused, ...).
"""

import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from daemon.specd.collect import collect_inventory
from specctl.config.cluster import ClusterConfig
from specctl.config.schema import NodeSpec
from specctl.planner.gather import InventoryError, fetch_inventory
from tui.core.specd_client import SpecdProblem, get_specd_json

RAY_STATUS_TIMEOUT_S = 5.0  # specd asks Ray in a subprocess: slower than the inventory
MAX_PARALLEL_NODES = 8


@dataclass(frozen=True, slots=True)
class GpuStatus:
    index: int
    name: str
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    utilization_percent: int | None
    temperature_c: int | None
    is_unified_memory: bool = False


@dataclass(frozen=True, slots=True)
class RayState:
    summary: str  # "head, 2 nodes alive", "not running", "unknown: ..."
    is_running: bool | None  # None: could not be told


RAY_UNKNOWN = RayState("unknown", None)


@dataclass(frozen=True, slots=True)
class NodeStatus:
    name: str
    address: str  # "local" or specd's host:port
    is_reachable: bool
    problem: str | None  # why the node could not be read; None when it was
    hostname: str | None = None
    num_cpus: int | None = None
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    gpus: tuple[GpuStatus, ...] = ()
    gpu_note: str | None = None  # why there are no GPUs (NVML's error), when there are none
    ray: RayState = RAY_UNKNOWN
    declared: str | None = None  # the hardware cluster.toml declares, for unreachable nodes
    read_unix_s: float = 0.0

    @property
    def is_local(self) -> bool:
        return self.address == "local"


def gpus_from_inventory(inventory: Mapping[str, Any]) -> tuple[GpuStatus, ...]:
    return tuple(
        GpuStatus(
            index=int(gpu.get("index", position)),
            name=str(gpu.get("name") or "GPU"),
            memory_total_bytes=gpu.get("memory_total_bytes"),
            memory_used_bytes=gpu.get("memory_used_bytes"),
            utilization_percent=gpu.get("utilization_gpu_percent"),
            temperature_c=gpu.get("temperature_c"),
            is_unified_memory=bool(gpu.get("unified_memory", False)),
        )
        for position, gpu in enumerate(inventory.get("gpus") or [])
    )


def status_from_inventory(
    node: NodeSpec, inventory: Mapping[str, Any], ray: RayState, now_unix_s: float
) -> NodeStatus:
    host = inventory.get("host") or {}
    gpus = gpus_from_inventory(inventory)
    note = None if gpus else f"CPU only ({inventory.get('nvml_error') or 'no GPUs found'})"
    return NodeStatus(
        name=node.name,
        address=node.specd,
        is_reachable=True,
        problem=None,
        hostname=host.get("hostname"),
        num_cpus=host.get("num_cpus"),
        memory_total_bytes=host.get("memory_total_bytes"),
        memory_available_bytes=host.get("memory_available_bytes"),
        gpus=gpus,
        gpu_note=note,
        ray=ray,
        read_unix_s=now_unix_s,
    )


def ray_state_from_specd(body: Mapping[str, Any]) -> RayState:
    """specd's RayStatus JSON -> one line."""
    if not body.get("running"):
        return RayState("not running", False)
    role = body.get("role") or "running"
    nodes = body.get("nodes") or []
    if body.get("error"):
        return RayState(f"{role}; cluster not readable: {str(body['error'])[:80]}", True)
    alive = sum(1 for item in nodes if item.get("alive"))
    return RayState(f"{role}, {alive} node(s) alive in the cluster", True)


def declared_hardware(node: NodeSpec) -> str | None:
    """What cluster.toml says the node has, in a few words; None when it says nothing."""
    parts = [
        f"{gpu.count} x {gpu.model} {gpu.memory_gib:g} GiB"
        + (" unified" if gpu.unified_memory else "")
        for gpu in node.gpus
    ]
    if node.memory_gib is not None:
        parts.append(f"{node.memory_gib:g} GiB memory")
    return ", ".join(parts) or None


def read_remote_node(config: ClusterConfig, node: NodeSpec, timeout_s: float) -> NodeStatus:
    now = time.time()
    try:
        inventory = fetch_inventory(config, node, timeout_s)
    except InventoryError as error:
        problem = f"specd at {node.specd}: {error}"
        declared = declared_hardware(node)
        return NodeStatus(node.name, node.specd, False, problem, declared=declared, read_unix_s=now)
    try:
        body = get_specd_json(config, node, "/v1/ray/status", max(timeout_s, RAY_STATUS_TIMEOUT_S))
        ray = ray_state_from_specd(body)
    except SpecdProblem as error:
        ray = RayState(f"unknown: {error}", None)
    return status_from_inventory(node, inventory, ray, now)


def read_cluster_nodes(
    config: ClusterConfig, timeout_s: float, local_ray: Mapping[str, RayState]
) -> list[NodeStatus]:
    """Every node of the config, in file order. `local_ray` holds the Ray state of local
    nodes by name (from the deployment's status; absent: unknown)."""
    statuses: dict[str, NodeStatus] = {}
    local_nodes = [node for node in config.nodes if node.is_local]
    remote_nodes = [node for node in config.nodes if not node.is_local]
    if local_nodes:
        now = time.time()
        inventory = collect_inventory(local_nodes[0].name).to_json()
        for node in local_nodes:
            ray = local_ray.get(node.name, RAY_UNKNOWN)
            statuses[node.name] = status_from_inventory(node, inventory, ray, now)
    if remote_nodes:
        workers = min(MAX_PARALLEL_NODES, len(remote_nodes))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            found = pool.map(lambda n: read_remote_node(config, n, timeout_s), remote_nodes)
            statuses.update((status.name, status) for status in found)
    return [statuses[node.name] for node in config.nodes]
