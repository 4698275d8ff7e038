"""Ray nodes on this machine, for `specd = "local"` nodes, tests and the demo.

Each local node is a real Ray node of its own (`ray start` with its own temp dir, ports,
labels and CPU count), started and stopped through the same `RayNode` that specd uses, so
labels, token authentication and teardown by session id are one piece of code. Its state
lives in a directory of its own; a later process (a second `specctl apply`, `specctl down`)
finds a node started earlier through the state file there.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

from daemon.shard.node_context import NODE_LABEL
from daemon.specd.api_models import RayStartRequest
from daemon.specd.collect import collect_inventory
from daemon.specd.config import RayConfig, SpecdConfig
from daemon.specd.ray_node import RayNode, RayNodeError, RunningNode
from specctl.cluster.ports import free_port

# Ray's unix socket paths under the temp dir must stay below 107 bytes: keep roots short.
MAX_TEMP_DIR_CHARS = 60
DEFAULT_OBJECT_STORE_BYTES = 100_000_000
# Ray's testing hook (its own spelling): delays the handling of calls on a node's processes.
ASIO_DELAY_ENV = "RAY_testing_asio_delay_us"


class LocalClusterError(Exception):
    """A local Ray node could not be started or stopped; the message says which and why."""


@dataclass(slots=True)
class LocalNodeSpec:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    num_cpus: int = 1
    # Emulated link latency for actor calls served on this node (microseconds): Ray's testing
    # hook RAY_testing_asio_delay_us, set for this node's processes only. None: no delay.
    actor_call_delay_us: int | None = None


LOCAL_STOP_GRACE_S = 3.0


def _node_config(
    spec: LocalNodeSpec, state_dir: Path, token_file: Path, head_port: int
) -> SpecdConfig:
    ray = RayConfig(
        port=head_port,
        client_server_port=free_port(),
        dashboard_agent_listen_port=free_port(),
        num_cpus=spec.num_cpus,
        num_gpus=0,
        object_store_memory_bytes=DEFAULT_OBJECT_STORE_BYTES,
        temp_dir=str(state_dir / "ray"),
        # Ray's head drains for ~10 s on SIGTERM; a local node going down has had its actors
        # killed already, so a short grace then SIGKILL loses nothing
        stop_grace_s=LOCAL_STOP_GRACE_S,
    )
    return SpecdConfig(
        token_file=str(token_file), node_name=spec.name, state_dir=str(state_dir), ray=ray
    )


class LocalNode:
    """One Ray node on this machine."""

    def __init__(self, spec: LocalNodeSpec, state_dir: Path, token_file: Path, head_port: int):
        if len(str(state_dir / "ray")) > MAX_TEMP_DIR_CHARS:
            raise LocalClusterError(
                f"{state_dir}: path too long for Ray's sockets (keep it under "
                f"{MAX_TEMP_DIR_CHARS - 4} characters)"
            )
        state_dir.mkdir(parents=True, exist_ok=True)
        self.spec = spec
        self.state_dir = state_dir
        self.config = _node_config(spec, state_dir, token_file, head_port)
        name = spec.name
        self._ray = RayNode(self.config, token_file, lambda: collect_inventory(name))

    @property
    def running(self) -> RunningNode | None:
        return self._ray.running

    def start(self, head_address: str | None) -> RunningNode:
        """Start as the head (`head_address` None) or as a worker of `head_address`."""
        role = "head" if head_address is None else "worker"
        labels = {**self.spec.labels, NODE_LABEL: self.spec.name}
        request = RayStartRequest(role=role, address=head_address, labels=labels)
        saved = os.environ.get(ASIO_DELAY_ENV)
        if self.spec.actor_call_delay_us is not None:
            delay = self.spec.actor_call_delay_us
            os.environ[ASIO_DELAY_ENV] = f"CoreWorkerService.grpc_server.PushTask={delay}:{delay}"
        try:
            node, _ = self._ray.start(request)
        except RayNodeError as exc:
            raise LocalClusterError(f"local node {self.spec.name}: {exc.message}") from None
        finally:
            if saved is None:
                os.environ.pop(ASIO_DELAY_ENV, None)
            else:
                os.environ[ASIO_DELAY_ENV] = saved
        return node

    def stop(self) -> list[int]:
        """Stop every process of this node; returns pids that would not die (empty: clean)."""
        _, leftover = self._ray.stop()
        return leftover
