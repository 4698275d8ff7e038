"""The plan: which shard runs where, on which GPUs, with which layers, whether it fits, and why.

A typed, JSON-serialisable object: the launcher deploys `shards`, the TUI shows `verdict`,
`explanation` and `problems` as the user edits, `specctl status` shows the stored plan
(`Plan.model_validate_json(row.plan_json)`).
"""

from typing import Literal

from pydantic import BaseModel, Field

from specctl.planner.facts import NodeFacts

Verdict = Literal["fits", "does_not_fit", "unknown"]
Role = Literal["verifier", "drafter"]


class MemoryPerRank(BaseModel):
    """What one rank (one GPU, or one process on CPU) of a shard holds."""

    weights_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    runtime_bytes: int
    total_bytes: int


class ShardPlan(BaseModel):
    """One shard: a pipeline stage of the verifier, or the drafter, of one replica."""

    id: str  # "r0/verifier/stage0", "r0/drafter"
    replica: int
    role: Role
    model: str
    model_path: str  # absolute
    dtype: str  # resolved: float32, bfloat16, float16, fp8
    node: str
    device: Literal["cuda", "cpu"]
    gpu_indices: list[int] = Field(default_factory=list)  # on the node; empty on CPU
    tensor_parallel_size: int
    stage: int = 0
    num_stages: int = 1
    layer_start: int  # first decoder layer held
    layer_end: int  # one past the last
    has_embedding: bool
    has_lm_head: bool
    max_batch_size: int
    max_model_len: int
    memory_per_rank: MemoryPerRank
    free_bytes: int | None  # what its devices had left when it was placed (smallest rank)
    verdict: Verdict

    @property
    def num_layers(self) -> int:
        return self.layer_end - self.layer_start


class DeviceUse(BaseModel):
    """A memory pool: one GPU, or a machine's memory for CPU shards (shared by the nodes on
    that machine)."""

    machine: str
    nodes: list[str]
    device: str  # "gpu0", "cpu"
    name: str  # "NVIDIA GeForce RTX 5090", "CPU memory"
    is_unified: bool = False
    total_bytes: int | None
    budget_bytes: int | None  # total x memory_utilization
    planned_bytes: int
    free_now_bytes: int | None  # read live, when the facts were
    shards: list[str] = Field(default_factory=list)


class SpeculationPlan(BaseModel):
    drafter: Literal["model", "ngram"]
    k: int | None  # fixed length; None when adaptive
    adaptive: bool
    max_k: int  # the most tokens drafted in one round
    mode: Literal["sync", "overlapped"]


class Plan(BaseModel):
    config_path: str | None
    deployment: str
    verdict: Verdict
    endpoint: str  # "http://127.0.0.1:8000/v1"
    replicas: int
    speculation: SpeculationPlan
    shards: list[ShardPlan]
    devices: list[DeviceUse]
    nodes: list[NodeFacts]
    explanation: list[str]  # one line per choice, in order
    problems: list[str]  # why it does not fit (or cannot be checked), and what would help
    warnings: list[str]  # fits, but worth knowing

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"

    def shards_of(self, replica: int) -> list[ShardPlan]:
        return [shard for shard in self.shards if shard.replica == replica]
