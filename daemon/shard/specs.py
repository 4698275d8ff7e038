"""What a shard is asked to run, and what it reports back: picklable dataclasses."""

import time
from dataclasses import dataclass, field
from typing import Literal

from daemon.runtime.parallel.group import DEFAULT_TIMEOUT_S

ShardState = Literal["loading", "ready", "failed", "stopped"]
ShardRole = Literal["verifier", "drafter", "stage"]


@dataclass(slots=True)
class VerifierSpec:
    target_dir: str
    dtype: str = "auto"
    max_batch_size: int = 16
    max_model_len: int | None = None
    max_waiting: int = 256
    # prompt tokens a step prefills while others decode (None: whole prompts at admission)
    prefill_chunk_tokens: int | None = None
    num_speculative_tokens: int = 4  # fixed k, or the ceiling when adaptive
    adaptive: bool = False
    # "none": target only; "draft_model"/"ngram": a proposer in this process (colocated);
    # "remote": the drafter shard named in `drafter_actor`, reached through Ray.
    proposer: Literal["none", "draft_model", "ngram", "remote"] = "none"
    draft_dir: str | None = None  # colocated draft model
    drafter_actor: str | None = None  # Ray actor name of the drafter shard (proposer "remote")
    mode: Literal["sync", "overlapped"] = "sync"  # remote proposer only
    sparse_top_k: int = 32  # a colocated draft model's proposals: tokens listed at most...
    sparse_mass: float = 1.0  # ...and no more than cover this much of its mass
    # a row's list widens up to this when tail drafts are rejected (None: never)
    sparse_max_listed: int | None = None
    # sampled rows: listed proposals measured against coupled drafts, the faster kept
    choose_proposal: bool = True
    num_threads: int | None = None  # torch intra-op threads in the shard process
    tensor_parallel_size: int = 1  # the target over this many ranks (this shard is rank 0)
    tp_timeout_s: float = DEFAULT_TIMEOUT_S  # bound on every collective of the group
    # pipeline parallel: this shard is the first stage, layers [0, end); the later stages are
    # the actors named here, in order (see StageSpec)
    layers: tuple[int, int] | None = None
    pipeline_stages: list[str] = field(default_factory=list)
    stage_timeout_s: float = DEFAULT_TIMEOUT_S  # bound on every call to a later stage


@dataclass(slots=True)
class StageSpec:
    """A later stage of a pipeline-parallel verifier: layers [start, end) of the target."""

    model_dir: str
    layers: tuple[int, int]
    num_slots: int  # the verifier's: the same slots and context length on every stage
    max_model_len: int | None = None
    dtype: str = "auto"
    num_threads: int | None = None


@dataclass(slots=True)
class DrafterSpec:
    draft_dir: str | None  # None: n-gram lookup, no model
    target_vocab_size: int | None = None  # checked against the draft's on load
    dtype: str = "auto"
    max_batch_size: int = 16
    max_model_len: int | None = None
    num_threads: int | None = None
    tensor_parallel_size: int = 1  # the draft over this many ranks (this shard is rank 0)
    tp_timeout_s: float = DEFAULT_TIMEOUT_S
    sparse_top_k: int = 32  # a sampled draft's proposal: tokens listed at most...
    sparse_mass: float = 1.0  # ...and no more than cover this much of its mass
    # a row's list widens up to this when tail drafts are rejected (None: never)
    sparse_max_listed: int | None = None
    # prompt tokens a round feeds the draft while others draft (the verifier's chunk size)
    prefill_chunk_tokens: int | None = None


@dataclass(slots=True)
class RankSpec:
    """Rank `rank` (> 0) of a tensor-parallel shard whose rank 0 listens at `address`."""

    model_dir: str
    rank: int
    size: int
    address: str  # host:port of rank 0's rendezvous, on this node
    num_slots: int  # rank 0's: the same slots and context length on every rank
    max_model_len: int | None = None
    dtype: str = "auto"
    timeout_s: float = DEFAULT_TIMEOUT_S
    num_threads: int | None = None


@dataclass(slots=True)
class ShardStatus:
    role: ShardRole
    state: ShardState
    node_id: str  # Ray node id the shard runs on
    node_name: str  # the node's specd.io/node label
    pid: int
    instance_id: str  # random per process: a restarted shard has a new one
    error: str | None = None
    loaded_bytes: int = 0
    total_bytes: int = 0
    load_time_s: float = 0.0
    time_s: float = field(default_factory=time.time)
