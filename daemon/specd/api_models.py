"""Pydantic models of the specd HTTP bodies."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from daemon.specd.address import parse_address
from daemon.specd.labels import label_key_error, label_value_error

MAX_LABELS = 32
MAX_LOG_LINES = 10_000


class RayStartRequest(BaseModel):
    """Join (worker) or found (head) the Ray cluster."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["head", "worker"]
    address: str | None = Field(
        None, max_length=300, description="host:port of the Ray head (GCS); workers only"
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Extra Ray node labels")

    @field_validator("address")
    @classmethod
    def _address_form(cls, value: str | None) -> str | None:
        if value is not None:
            parse_address(value)
        return value

    @field_validator("labels")
    @classmethod
    def _label_syntax(cls, labels: dict[str, str]) -> dict[str, str]:
        if len(labels) > MAX_LABELS:
            raise ValueError(f"at most {MAX_LABELS} labels, got {len(labels)}")
        for key, value in labels.items():
            error = label_key_error(key) or label_value_error(value)
            if error:
                raise ValueError(error)
        return labels

    @model_validator(mode="after")
    def _address_matches_role(self) -> "RayStartRequest":
        if self.role == "worker" and self.address is None:
            raise ValueError("a worker needs 'address', the host:port of the Ray head")
        if self.role == "head" and self.address is not None:
            raise ValueError("a head takes no 'address' (its port is ray.port in specd.toml)")
        return self


class RayNodeInfo(BaseModel):
    node_id: str
    address: str
    alive: bool
    labels: dict[str, str]
    resources: dict[str, float]


class RayStatus(BaseModel):
    running: bool
    role: Literal["head", "worker"] | None = None
    gcs_address: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    nodes: list[RayNodeInfo] = Field(default_factory=list)
    error: str | None = Field(None, description="Why the cluster could not be queried")


class RayStartResponse(BaseModel):
    started: bool = Field(description="False when Ray was already running as asked (no-op)")
    status: RayStatus


class RayStopResponse(BaseModel):
    stopped: bool = Field(description="False when Ray was not running (no-op)")
    leftover_pids: list[int] = Field(default_factory=list)


class ErrorBody(BaseModel):
    error: str
    field: str | None = None
    details: list[dict[str, Any]] | None = None
