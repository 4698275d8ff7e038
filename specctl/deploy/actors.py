"""Shard actors: named, detached (they outlive `specctl apply`), placed on a node by label."""

from dataclasses import dataclass
from typing import Any

from daemon.shard.node_context import NODE_LABEL
from daemon.shard.specs import DrafterSpec, VerifierSpec
from daemon.shard.verifier import VerifierShard
from specctl.deploy.ray_connect import NAMESPACE

# The verifier serves submit/abort while a poll waits: a few threads.
VERIFIER_CONCURRENCY = 8
# Calls on the drafter are handled one at a time, in the order they were sent.
DRAFTER_CONCURRENCY = 1


@dataclass(slots=True)
class Placement:
    node: str  # the node's name in cluster.toml (its specctl.io/node label)
    num_cpus: float = 0.0  # CPUs the shard reserves (0: placement by label alone)
    num_gpus: float = 0.0
    max_restarts: int = 0  # Ray restarts a dead shard this many times (-1: always)


def _options(name: str, placement: Placement, concurrency: int) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": NAMESPACE,
        "lifetime": "detached",
        "label_selector": {NODE_LABEL: placement.node},
        "num_cpus": placement.num_cpus,
        "num_gpus": placement.num_gpus,
        "max_concurrency": concurrency,
        "max_restarts": placement.max_restarts,
        "max_task_retries": 0,  # a call is never replayed on a restarted shard
    }


def create_verifier(name: str, spec: VerifierSpec, placement: Placement) -> Any:
    import ray

    actor_class = ray.remote(VerifierShard)
    return actor_class.options(**_options(name, placement, VERIFIER_CONCURRENCY)).remote(spec)


def create_drafter(name: str, spec: DrafterSpec, placement: Placement) -> Any:
    import ray

    from daemon.shard.drafter import DrafterShard

    actor_class = ray.remote(DrafterShard)
    return actor_class.options(**_options(name, placement, DRAFTER_CONCURRENCY)).remote(spec)


def find_actor(name: str) -> Any | None:
    """The live actor of that name in specctl's namespace, or None."""
    import ray

    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def kill_actor(name: str) -> bool:
    """Kill the named shard for good (no restart); False if there was none."""
    import ray

    handle = find_actor(name)
    if handle is None:
        return False
    ray.kill(handle, no_restart=True)
    return True
