"""Who and where this shard process is: Ray node id and name, pid, a per-process instance id."""

import os
import uuid
from dataclasses import dataclass

# The name cluster.toml gives a node: `apply` labels every Ray node with it (local nodes and
# specd nodes alike), and shards are placed by it.
NODE_LABEL = "specctl.io/node"
SPECD_NODE_LABEL = "specd.io/node"  # what specd derives from its own host name


@dataclass(frozen=True, slots=True)
class NodeContext:
    node_id: str
    node_name: str
    pid: int
    instance_id: str

    @staticmethod
    def current() -> "NodeContext":
        """Inside a Ray worker: this node; outside Ray (tests, one process): "local"."""
        node_id, node_name = "local", "local"
        try:
            import ray

            if ray.is_initialized():
                context = ray.get_runtime_context()
                node_id = context.get_node_id()
                labels = context.get_node_labels()
                value = labels.get(NODE_LABEL) or labels.get(SPECD_NODE_LABEL) or node_id
                node_name = value[0] if isinstance(value, list) else str(value)
        except ImportError:
            pass
        return NodeContext(node_id, node_name, os.getpid(), uuid.uuid4().hex)
