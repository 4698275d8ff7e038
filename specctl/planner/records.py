"""A shard on its way into the plan: what is being placed, and the ShardPlan it becomes."""

from dataclasses import dataclass

from specctl.config.cluster import ClusterConfig
from specctl.planner.devices import Device
from specctl.planner.memory import MemoryNeed, ShardLayout
from specctl.planner.plan import MemoryPerRank, Role, ShardPlan, Verdict


@dataclass(frozen=True, slots=True)
class Placement:
    """A shard about to be placed: who it is, where it goes, what it holds."""

    shard_id: str  # "r0/verifier/stage1"
    role: Role
    replica: int
    label: str  # how the plan's sentences name it: "verifier llama-70b stage 1 (layers 64-79)"
    model: str
    node: str
    layout: ShardLayout
    stage: int = 0
    layer_start: int = 0


def shard_plan(
    placement: Placement,
    config: ClusterConfig,
    layout: ShardLayout,
    ranks: list[Device],
    need: MemoryNeed,
    free: int | None,
    verdict: Verdict,
    num_stages: int,
) -> ShardPlan:
    return ShardPlan(
        id=placement.shard_id,
        replica=placement.replica,
        role=placement.role,
        model=placement.model,
        model_path=str(config.model_dir(placement.model)),
        dtype=layout.dtype,
        node=placement.node,
        device="cuda" if layout.on_gpu else "cpu",
        gpu_indices=[int(d.device.removeprefix("gpu")) for d in ranks if d.is_gpu],
        tensor_parallel_size=layout.tensor_parallel_size,
        stage=placement.stage,
        num_stages=num_stages,
        layer_start=placement.layer_start,
        layer_end=placement.layer_start + layout.num_layers,
        has_embedding=layout.has_embedding,
        has_lm_head=layout.has_lm_head or layout.samples,
        max_batch_size=layout.max_batch_size,
        max_model_len=layout.max_model_len,
        memory_per_rank=MemoryPerRank(
            weights_bytes=need.weights_bytes,
            kv_cache_bytes=need.kv_cache_bytes,
            activation_bytes=need.activation_bytes,
            runtime_bytes=need.runtime_bytes,
            total_bytes=need.total_bytes,
        ),
        free_bytes=free,
        verdict=verdict,
    )
