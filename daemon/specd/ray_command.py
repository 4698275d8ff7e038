"""The `ray start` command line and environment specd uses: token auth on, dashboard and
usage stats off, labels from the inventory."""

import os
import sys
from pathlib import Path

from daemon.specd.config import RayConfig
from daemon.specd.labels import format_labels

# Ray 2.52+ token authentication: every Ray RPC must carry the cluster token.
AUTH_ENV = {"RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0"}
# Ray looks for a token in these too; specd sets the token path and nothing else.
_FOREIGN_TOKEN_VARS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def ray_executable() -> str:
    """The `ray` script next to this interpreter (the venv's), else the one on PATH."""
    candidate = Path(sys.executable).parent / "ray"
    return str(candidate) if candidate.exists() else "ray"


def ray_env(token_file: Path) -> dict[str, str]:
    """Environment for Ray processes: token mode, token read from the cluster token file."""
    env = {key: value for key, value in os.environ.items() if key not in _FOREIGN_TOKEN_VARS}
    env.update(AUTH_ENV)
    env["RAY_AUTH_TOKEN_PATH"] = str(token_file)
    return env


def _common_args(
    config: RayConfig, temp_dir: Path, node_name: str, labels: dict[str, str]
) -> list[str]:
    args = [
        f"--temp-dir={temp_dir}",
        f"--node-name={node_name}",
        f"--labels={format_labels(labels)}",
        f"--dashboard-agent-listen-port={config.dashboard_agent_listen_port}",
        "--disable-usage-stats",
    ]
    if config.node_ip_address:
        args.append(f"--node-ip-address={config.node_ip_address}")
    if config.num_cpus is not None:
        args.append(f"--num-cpus={config.num_cpus}")
    if config.num_gpus is not None:
        args.append(f"--num-gpus={config.num_gpus}")
    if config.object_store_memory_bytes is not None:
        args.append(f"--object-store-memory={config.object_store_memory_bytes}")
    return args


def head_command(
    config: RayConfig, temp_dir: Path, node_name: str, labels: dict[str, str]
) -> list[str]:
    return [
        ray_executable(),
        "start",
        "--head",
        f"--port={config.port}",
        f"--ray-client-server-port={config.client_server_port}",
        "--include-dashboard=false",
        *_common_args(config, temp_dir, node_name, labels),
    ]


def worker_command(
    config: RayConfig, address: str, temp_dir: Path, node_name: str, labels: dict[str, str]
) -> list[str]:
    return [
        ray_executable(),
        "start",
        f"--address={address}",
        *_common_args(config, temp_dir, node_name, labels),
    ]
