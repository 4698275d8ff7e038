"""What is deployed now, for the Launch and Nodes screens: the deployment apply recorded
(`state.json`), whether its serving process lives and answers, and the Ray state of the local
nodes it started. Read from files and the process table, plus one short /health request;
nothing here imports ray or raises: what cannot be read is said."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from specctl.apply.state import AppliedState, StateError
from specctl.apply.watch_record import live_watch
from specctl.cluster.local_cluster import HEAD_PORT_FILE, node_dir_name
from specctl.cluster.local_nodes import LocalClusterError, LocalNode, LocalNodeSpec
from specctl.deploy.server_process import ServerRecord, ServerRecordError
from specctl.home import SpecctlHome
from tui.core.nodes import RayState

HEALTH_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class DeploymentStatus:
    deployment: str | None = None  # None: nothing applied
    config_path: str | None = None
    endpoint: str | None = None
    server_pid: int | None = None
    is_server_alive: bool = False
    is_server_healthy: bool = False
    shards: tuple[tuple[str, str, str], ...] = ()  # (actor, role, node)
    local_ray: dict[str, RayState] = field(default_factory=dict)  # by node name
    problem: str | None = None  # why the state could not be read
    watch: str | None = None  # the `apply --watch` keeping it running, described; None: none

    def summary(self) -> str:
        if self.problem:
            said = self.problem
        elif self.deployment is None:
            said = "nothing deployed"
        elif not self.is_server_alive:
            said = f"{self.deployment}: applied, but its serving process is not running"
        else:
            health = "answering" if self.is_server_healthy else "not answering /health"
            said = f"{self.deployment} at {self.endpoint} ({health})"
        return said + (f"\nkept running by a watch: {self.watch}" if self.watch else "")


def local_ray_state(root: Path, name: str, token_file: Path) -> RayState:
    """The Ray state of local node `name` of the cluster apply started under `root`."""
    state_dir, head_port_file = root / node_dir_name(name), root / HEAD_PORT_FILE
    if not state_dir.is_dir() or not head_port_file.exists():  # never started, or stopped
        return RayState("not running", False)
    try:
        head_port = int(json.loads(head_port_file.read_text()))
        node = LocalNode(LocalNodeSpec(name), state_dir, token_file, head_port)
        running = node.running
    except (LocalClusterError, OSError, ValueError) as error:  # ValueError: pydantic's too
        return RayState(f"unknown: {str(error).splitlines()[0]}", None)
    if running is None:
        return RayState("not running", False)
    return RayState(f"{running.role}, {running.gcs_address}", True)


def _is_healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=HEALTH_TIMEOUT_S).status_code == 200
    except httpx.HTTPError:
        return False


def read_deployment_status(home: SpecctlHome) -> DeploymentStatus:
    # the watch in every case: one in its first apply runs while nothing is applied yet
    watch = watching.describe() if (watching := live_watch(home)) else None
    try:
        state = AppliedState.load(home.state_file)
    except StateError as error:
        return DeploymentStatus(problem=str(error), watch=watch)
    try:
        record = ServerRecord.load(home.server_file)
    except ServerRecordError as error:  # raised in a worker thread, it ended the whole app
        return DeploymentStatus(problem=str(error), watch=watch)
    is_alive = record is not None and record.is_alive()
    if state is None:
        pid = record.pid if record else None
        return DeploymentStatus(server_pid=pid, is_server_alive=is_alive, watch=watch)
    local_ray: dict[str, RayState] = {}
    if state.local_root:
        root, token = Path(state.local_root), Path(state.token_file)
        local_ray = {name: local_ray_state(root, name, token) for name in state.local_nodes}
    url = record.url if record else (state.server.url if state.server else None)
    return DeploymentStatus(
        deployment=state.deployment,
        config_path=state.config_path,
        endpoint=f"{url}/v1" if url else None,
        server_pid=record.pid if record else None,
        is_server_alive=is_alive,
        is_server_healthy=is_alive and url is not None and _is_healthy(url),
        shards=tuple((s.actor, s.role, s.node) for s in state.shards),
        local_ray=local_ray,
        watch=watch,
    )
