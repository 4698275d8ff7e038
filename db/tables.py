"""The store's tables, as SQLModel classes: the schema at the current version.

The SQL that creates them lives in migrations.py, one step per schema version; a test checks
that migrating an empty file ends with exactly these tables and columns. Times are Unix seconds
(float) so that range queries and sparklines need no date parsing; durations are in ms.
"""

from typing import Any

from sqlalchemy import JSON, Column, Index, UniqueConstraint
from sqlmodel import Field, SQLModel


class NodeRow(SQLModel, table=True):
    """A node of the cluster as last seen (one row per node name, updated in place)."""

    __tablename__ = "node"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True)
    address: str  # specd host:port, or "local"
    labels: dict[str, str] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    num_cpus: int | None = None
    memory_total_bytes: int | None = None
    is_reachable: bool = True
    error: str | None = None  # why the node could not be reached or read, when it could not
    last_seen_unix_s: float


class GpuRow(SQLModel, table=True):
    """A GPU of a node as last seen (one row per node and GPU index, updated in place)."""

    __tablename__ = "gpu"
    __table_args__ = (UniqueConstraint("node_name", "gpu_index"),)

    id: int | None = Field(default=None, primary_key=True)
    node_name: str
    gpu_index: int
    model: str | None = None  # "NVIDIA GeForce RTX 5090"
    memory_total_bytes: int | None = None  # None when the GPU cannot report it
    memory_used_bytes: int | None = None
    is_unified_memory: bool = False
    utilization_percent: int | None = None
    temperature_c: int | None = None
    last_seen_unix_s: float


DEPLOYMENT_STATUSES = ("applying", "running", "failed", "stopped")


class DeploymentRow(SQLModel, table=True):
    """One `specctl apply`: the cluster.toml text it applied and the plan it followed."""

    __tablename__ = "deployment"

    id: int | None = Field(default=None, primary_key=True)
    name: str
    config_path: str
    config_text: str
    plan_json: str
    applied_unix_s: float
    status: str  # one of DEPLOYMENT_STATUSES
    status_message: str | None = None
    endpoint: str | None = None  # "http://127.0.0.1:8000/v1" once serving


class MetricSample(SQLModel, table=True):
    """One second of a deployment's serving, written by the serving process."""

    __tablename__ = "metric_sample"
    __table_args__ = (Index("ix_metric_sample_deployment_time", "deployment_id", "time_unix_s"),)

    id: int | None = Field(default=None, primary_key=True)
    deployment_id: int
    time_unix_s: float
    acceptance_rate: float | None = None  # accepted / drafted tokens; None: nothing drafted
    # [max_k] conditional acceptance at each draft position
    per_position_acceptance: list[float] = Field(
        default_factory=list, sa_column=Column(JSON, nullable=False)
    )
    mean_acceptance_length: float | None = None  # tokens committed per verify round
    tokens_per_s: float = 0.0
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None  # time per output token
    tpot_p99_ms: float | None = None
    batch_size: int = 0
    k_in_use: float | None = None  # mean speculation length over the second's rounds
    num_requests_running: int = 0
    num_requests_waiting: int = 0


class GpuSample(SQLModel, table=True):
    """One reading of one GPU (or of a CPU node's memory, gpu_index -1)."""

    __tablename__ = "gpu_sample"
    __table_args__ = (Index("ix_gpu_sample_time", "time_unix_s"),)

    id: int | None = Field(default=None, primary_key=True)
    node_name: str
    gpu_index: int
    time_unix_s: float
    utilization_percent: int | None = None
    memory_used_bytes: int | None = None
    temperature_c: int | None = None  # schema v2
    power_draw_w: float | None = None  # schema v2


class RequestRecord(SQLModel, table=True):
    """One finished request."""

    __tablename__ = "request_record"
    __table_args__ = (Index("ix_request_record_finished", "finished_unix_s"),)

    id: int | None = Field(default=None, primary_key=True)
    request_id: str
    deployment_id: int
    num_prompt_tokens: int
    num_output_tokens: int
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    ttft_ms: float | None = None
    e2e_latency_ms: float
    finish_reason: str  # "stop", "length", "abort", "error"
    finished_unix_s: float


ALL_TABLES: tuple[type[SQLModel], ...] = (
    NodeRow,
    GpuRow,
    DeploymentRow,
    MetricSample,
    GpuSample,
    RequestRecord,
)


def insert_values(row: SQLModel) -> dict[str, Any]:
    """The column values of `row` for an INSERT (the id is left to SQLite)."""
    return row.model_dump(exclude={"id"})
