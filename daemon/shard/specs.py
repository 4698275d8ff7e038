"""What a shard is asked to run, and what it reports back: picklable dataclasses."""

import time
from dataclasses import dataclass, field
from typing import Literal

ShardState = Literal["loading", "ready", "failed", "stopped"]


@dataclass(slots=True)
class VerifierSpec:
    target_dir: str
    dtype: str = "auto"
    max_batch_size: int = 16
    max_model_len: int | None = None
    max_waiting: int = 256
    num_speculative_tokens: int = 4  # fixed k, or the ceiling when adaptive
    adaptive: bool = False
    # "none": target only; "draft_model"/"ngram": a proposer in this process (colocated);
    # "remote": the drafter shard named in `drafter_actor`, reached through Ray.
    proposer: Literal["none", "draft_model", "ngram", "remote"] = "none"
    draft_dir: str | None = None  # colocated draft model
    drafter_actor: str | None = None  # Ray actor name of the drafter shard (proposer "remote")
    mode: Literal["sync", "overlapped"] = "sync"  # remote proposer only
    num_threads: int | None = None  # torch intra-op threads in the shard process


@dataclass(slots=True)
class DrafterSpec:
    draft_dir: str | None  # None: n-gram lookup, no model
    target_vocab_size: int | None = None  # checked against the draft's on load
    dtype: str = "auto"
    max_batch_size: int = 16
    max_model_len: int | None = None
    num_threads: int | None = None


@dataclass(slots=True)
class ShardStatus:
    role: Literal["verifier", "drafter"]
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
