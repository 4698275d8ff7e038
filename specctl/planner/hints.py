"""What would make a shard fit: concrete numbers where they are cheap to work out."""

from dataclasses import replace

from specctl.config.cluster import ClusterConfig
from specctl.planner.devices import Device, DevicePool
from specctl.planner.memory import ShardLayout, memory_per_rank
from specctl.planner.wording import size

SMALLER_DTYPE = {"float32": "bfloat16", "bfloat16": "fp8", "float16": "fp8"}
MIN_CONTEXT = 256


def fit_hints(
    config: ClusterConfig,
    pool: DevicePool,
    labels: dict[str, str],
    label: str,
    node: str,
    ranks: list[Device],
    layout: ShardLayout,
    short_bytes: int,
) -> list[str]:
    is_drafter = " drafter " in f" {label} "
    model = config.deployment.drafter.model if is_drafter else config.deployment.verifier.model
    hints = _kv_hints(layout, short_bytes)
    smaller = SMALLER_DTYPE.get(layout.dtype)
    if smaller is not None:
        weights = memory_per_rank(layout).weights_bytes
        saved = weights - memory_per_rank(replace(layout, dtype=smaller)).weights_bytes
        hints.append(f'dtype = "{smaller}" for {model} (saves {size(saved)} per rank)')
    others = sorted({shard for device in ranks for shard in device.shards})
    if others:
        where = "GPU" if ranks[0].is_gpu else "machine"
        named = ", ".join(labels.get(shard, shard) for shard in others)
        hints.append(f"moving {named} off this {where}")
    if is_drafter:
        hints += _other_nodes(config, pool, node, memory_per_rank(layout).total_bytes)
        hints.append('drafter model = "ngram" (prompt lookup: no model memory)')
    else:
        hints.append("another node in deployment.verifier.nodes (the layers split across them)")
        num_gpus = len([d for d in pool.of_node(node) or [] if d.is_gpu])
        tp = layout.tensor_parallel_size
        if num_gpus >= 2 * tp:
            hints.append(f"tensor_parallel_size {2 * tp} ({node} has {num_gpus} GPUs)")
    return hints


def _kv_hints(layout: ShardLayout, short_bytes: int) -> list[str]:
    """The batch size or context length whose KV cache leaves room for the rest."""
    kv_bytes = memory_per_rank(layout).kv_cache_bytes
    if kv_bytes <= short_bytes:
        if kv_bytes >= short_bytes // 4:
            return [
                f"a smaller max_batch_size or max_model_len (the KV cache takes {size(kv_bytes)})"
            ]
        return []
    keep = (kv_bytes - short_bytes) / kv_bytes
    hints = []
    batch = int(layout.max_batch_size * keep)
    if batch >= 1:
        hints.append(f"max_batch_size = {batch} (now {layout.max_batch_size})")
    context = int(layout.max_model_len * keep) // MIN_CONTEXT * MIN_CONTEXT
    if context >= MIN_CONTEXT:
        hints.append(f"max_model_len = {context} (now {layout.max_model_len})")
    return hints


def _other_nodes(config: ClusterConfig, pool: DevicePool, node: str, need: int) -> list[str]:
    hints = []
    for other in config.nodes:
        if other.name == node:
            continue
        devices = pool.of_node(other.name) or []
        best = max((d.remaining_bytes or 0 for d in devices), default=0)
        if best >= need:
            hints.append(f"the drafter on {other.name} ({size(best)} free)")
    return hints
