"""What a plan may hold that `specctl apply` cannot deploy yet: `plan` warns of it, and `apply`
refuses it before it starts anything. The planner plans more than the runtime runs (an fp8
checkpoint's memory, a verifier split both ways), so that an operator can size machines
ahead of the runtime."""

from specctl.planner.plan import ShardPlan

RUNTIME_DTYPES = ("float32", "bfloat16", "float16")  # what the shards load weights as


def not_deployable(shards: list[ShardPlan]) -> list[str]:
    """One sentence per reason the shards cannot be deployed as planned (empty: they can)."""
    reasons = [
        f"{shard.id}: dtype {shard.dtype} is for planning only; the runtime loads "
        f"{', '.join(RUNTIME_DTYPES)}"
        for shard in shards
        if shard.dtype not in RUNTIME_DTYPES
    ]
    for replica in sorted({shard.replica for shard in shards}):
        verifiers = [s for s in shards if s.replica == replica and s.role == "verifier"]
        if len(verifiers) > 1 and any(v.tensor_parallel_size > 1 for v in verifiers):
            reasons.append(
                f"r{replica}: the verifier is split into {len(verifiers)} pipeline stages with "
                "tensor parallelism in each; that combination is not deployable yet: use "
                "tensor_parallel_size = 1 with several nodes, or one node"
            )
    return reasons
