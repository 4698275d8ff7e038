"""Shard actors: named, detached (they outlive `specctl apply`), placed on a node by label."""

from dataclasses import dataclass, replace
from typing import Any

from daemon.shard.node_context import NODE_LABEL
from daemon.shard.specs import DrafterSpec, RankSpec, StageSpec, VerifierSpec
from daemon.shard.verifier import VerifierShard
from specctl.deploy.ray_connect import NAMESPACE

# The verifier serves submit/abort while a poll waits: a few threads.
VERIFIER_CONCURRENCY = 8
# Calls on the drafter are handled one at a time, in the order they were sent.
DRAFTER_CONCURRENCY = 1
# A tensor-parallel rank's `run` blocks for its whole life; `status` answers beside it.
RANK_CONCURRENCY = 2
ADDRESS_TIMEOUT_S = 60.0
# A stage's model calls come one at a time from its verifier; status answers beside them.
STAGE_CONCURRENCY = 2


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


def create_stage(name: str, spec: StageSpec, placement: Placement) -> Any:
    """A later stage of a pipeline-parallel verifier (the verifier finds it by name)."""
    import ray

    from daemon.shard.pipeline_stage import PipelineStageShard

    actor_class = ray.remote(PipelineStageShard)
    return actor_class.options(**_options(name, placement, STAGE_CONCURRENCY)).remote(spec)


def rank_name(shard_name: str, rank: int) -> str:
    return f"{shard_name}.rank{rank}"


def start_ranks(
    shard_name: str,
    leader: Any,
    template: RankSpec,
    placement: Placement,
) -> list[Any]:
    """Ranks 1..size-1 of the tensor-parallel shard `leader` (its rank 0), on its node: each
    joins the group at the address rank 0 picked, loads its part and follows rank 0. A rank
    is never restarted on its own (a group cannot take a new member): rank 0 fails its
    requests within the group's timeout instead, and `apply` replaces the whole shard."""
    import ray

    from daemon.shard.tensor_parallel_rank import TensorParallelRank

    address = ray.get(leader.tensor_parallel_address.remote(), timeout=ADDRESS_TIMEOUT_S)
    actor_class = ray.remote(TensorParallelRank)
    own = replace(placement, max_restarts=0)
    handles = []
    for rank in range(1, template.size):
        spec = replace(template, rank=rank, address=address)
        options = _options(rank_name(shard_name, rank), own, RANK_CONCURRENCY)
        handle = actor_class.options(**options).remote(spec)
        handle.run.remote()
        handles.append(handle)
    return handles


def ask_statuses(handles: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Every shard's `status()`, all asked at once and answered within `timeout_s` together:
    a frozen shard (its node hung) costs the question one timeout, not one per shard. Each
    name maps to its ShardStatus, or to the exception that stood for it (no answer in time,
    a dead actor, a handle Ray could not call)."""
    import ray

    answers: dict[str, Any] = {}
    calls: dict[str, Any] = {}
    for name, handle in handles.items():
        try:
            calls[name] = handle.status.remote()
        except Exception as exc:
            answers[name] = exc
    if calls:
        ray.wait(list(calls.values()), num_returns=len(calls), timeout=timeout_s)
    for name, ref in calls.items():
        try:
            answers[name] = ray.get(ref, timeout=0)  # answered within the wait, or not at all
        except Exception as exc:
            answers[name] = exc
    return answers


def first_line(exc: BaseException) -> str:
    """An exception as one line, "Type: first line" (a Ray task error's is a traceback)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def find_actor(name: str) -> Any | None:
    """The live actor of that name in specctl's namespace, or None."""
    import ray

    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def kill_actor(name: str) -> bool:
    """Kill the named shard for good (no restart), and its tensor-parallel ranks if it has
    any; False if there was no such shard."""
    import ray

    handle = find_actor(name)
    rank = 1
    while (peer := find_actor(rank_name(name, rank))) is not None:
        ray.kill(peer, no_restart=True)
        rank += 1
    if handle is None:
        return False
    ray.kill(handle, no_restart=True)
    return True
