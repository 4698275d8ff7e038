"""Wait until the cluster lists each node of the file once, alive, before shards are placed.

A node started again after its raylet died joins under a new Ray node id while the GCS still
lists the dead one as alive, until its health checks have failed (~15-30 s): a shard placed
by the node's label then could land on the dead one, and came up only after Ray restarted it
on the new one, after apply had said it was loaded.
"""

import time
from collections.abc import Callable
from typing import Any

from daemon.shard.node_context import NODE_LABEL

LIVE_NODES_TIMEOUT_S = 90.0  # Ray marks a silent node dead after ~15-30 s by default
LIVE_NODES_POLL_S = 0.5


class LiveNodesError(Exception):
    """The cluster did not settle to one live Ray node per listed node in time."""


def live_node_counts(nodes: list[dict[str, Any]], names: list[str]) -> dict[str, int]:
    """How many alive Ray nodes carry each name's node label (`nodes`: ray.nodes())."""
    counts = dict.fromkeys(names, 0)
    for node in nodes:
        name = (node.get("Labels") or {}).get(NODE_LABEL)
        if node.get("Alive") and name in counts:
            counts[name] += 1
    return counts


def wait_one_live_node_each(
    names: list[str],
    timeout_s: float = LIVE_NODES_TIMEOUT_S,
    on_wait: Callable[[dict[str, int]], None] | None = None,
) -> bool:
    """Block until every name is the label of exactly one alive Ray node (this process is
    a connected driver); True if that took waiting (a node's old self was still listed).
    `on_wait` is called once, with the counts, when the first look finds them wrong."""
    import ray

    deadline = time.monotonic() + timeout_s
    waited = False
    while True:
        counts = live_node_counts(ray.nodes(), names)
        wrong = {name: n for name, n in counts.items() if n != 1}
        if not wrong:
            return waited
        if not waited and on_wait is not None:
            on_wait(counts)
        if time.monotonic() >= deadline:
            said = ", ".join(f"{name}: {n}" for name, n in sorted(wrong.items()))
            raise LiveNodesError(
                f"after {timeout_s:g} s Ray does not list each node once, alive (live Ray "
                f"nodes by name: {said}); a node restarted after its raylet died is listed "
                "twice until Ray's health checks mark its old self dead"
            )
        waited = True
        time.sleep(LIVE_NODES_POLL_S)
