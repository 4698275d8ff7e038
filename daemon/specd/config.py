"""specd configuration: a TOML file (specd.toml) overridden by command-line flags."""

import socket
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from daemon.specd.address import check_host

DEFAULT_HOST = "127.0.0.1"  # never 0.0.0.0 unless the operator says so
DEFAULT_PORT = 7601
DEFAULT_TOKEN_FILE = "/etc/specd/cluster.token"
DEFAULT_STATE_DIR = "/var/lib/specd"
# the ports Ray hands its worker processes (`ray start`'s --min/--max-worker-port defaults): a
# server of the node's own on one of them fails as soon as a worker takes it first
RAY_WORKER_PORTS = range(10002, 20000)
RAY_PORT_FIELDS = ("port", "client_server_port", "dashboard_agent_listen_port")  # a node's own


class ConfigError(Exception):
    """The configuration is unusable; the message names the file or flag and the field."""


def _outside_worker_ports(port: int) -> int:
    if port in RAY_WORKER_PORTS:
        raise ValueError(
            f"{port} is one of the ports Ray gives its workers "
            f"({RAY_WORKER_PORTS.start}-{RAY_WORKER_PORTS.stop - 1}): pick one outside"
        )
    return port


class RayConfig(BaseModel):
    """How this node runs Ray."""

    model_config = ConfigDict(extra="forbid")

    port: int = Field(6379, ge=1, le=65535, description="GCS port when this node is the head")
    node_ip_address: str | None = Field(None, description="Address other nodes reach this on")
    client_server_port: int = Field(10001, ge=1, le=65535, description="Ray client (head)")
    dashboard_agent_listen_port: int = Field(52365, ge=1, le=65535)
    num_cpus: int | None = Field(None, ge=0)
    num_gpus: int | None = Field(None, ge=0)
    object_store_memory_bytes: int | None = Field(None, ge=78643200)  # Ray's minimum, 75 MiB
    temp_dir: str | None = Field(None, description="Ray's temp dir; default STATE_DIR/ray")
    start_timeout_s: float = Field(120.0, gt=0, le=3600)
    stop_grace_s: float = Field(10.0, gt=0, le=600)
    probe_timeout_s: float = Field(60.0, gt=0, le=600)
    head_connect_timeout_s: float = Field(3.0, gt=0, le=60)

    _outside_worker_ports = field_validator(*RAY_PORT_FIELDS)(
        classmethod(lambda cls, v: _outside_worker_ports(v))
    )

    @model_validator(mode="after")
    def _distinct_ports(self) -> "RayConfig":
        seen: dict[int, str] = {}
        for name in RAY_PORT_FIELDS:
            value = getattr(self, name)
            if value in seen:
                raise ValueError(f"{name} and {seen[value]} are both {value}: each needs its own")
            seen[value] = name
        return self


class SpecdConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field(DEFAULT_HOST, min_length=1, description="Address the API binds to")
    port: int = Field(DEFAULT_PORT, ge=1, le=65535)
    token_file: str = Field(DEFAULT_TOKEN_FILE, min_length=1)
    node_name: str = Field(default_factory=socket.gethostname, min_length=1, max_length=253)
    state_dir: str = Field(DEFAULT_STATE_DIR, min_length=1, description="Logs and Ray state")
    ray: RayConfig = Field(default_factory=RayConfig)

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        """An address to bind: "256.1.1.1" passed, and uvicorn failed later on it."""
        return check_host(value)

    _api_port_outside_worker_ports = field_validator("port")(
        classmethod(lambda cls, v: _outside_worker_ports(v))
    )

    @model_validator(mode="after")
    def _api_port_apart(self) -> "SpecdConfig":
        ray = self.ray
        for name in RAY_PORT_FIELDS:
            if getattr(ray, name) == self.port:
                raise ValueError(f"port and ray.{name} are both {self.port}: each needs its own")
        return self

    @property
    def log_file(self) -> Path:
        return Path(self.state_dir) / "specd.log"

    @property
    def ray_temp_dir(self) -> Path:
        return Path(self.ray.temp_dir) if self.ray.temp_dir else Path(self.state_dir) / "ray"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read config file: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML: {error}") from None


def _describe(error: ValidationError, path: Path | None, flags: set[str]) -> str:
    lines = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"])
        top = str(item["loc"][0]) if item["loc"] else ""
        if top in flags:
            where = f"--{top.replace('_', '-')}"
        elif path is not None:
            where = f"{path}: field '{field}'"
        else:
            where = f"field '{field}'"
        lines.append(f"{where}: {item['msg'].removeprefix('Value error, ')}")
    return "invalid specd configuration:\n  " + "\n  ".join(lines)


def load_config(path: Path | None, overrides: dict[str, Any]) -> SpecdConfig:
    """Read `path` (if given), apply the flags in `overrides` (None values are ignored)."""
    data = _read_toml(path) if path is not None else {}
    flags = {key: value for key, value in overrides.items() if value is not None}
    data.update(flags)
    try:
        return SpecdConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe(error, path, set(flags))) from None
