"""Ask the Ray cluster which nodes it has, through `daemon.specd.ray_probe` in a subprocess."""

import json
import subprocess
import sys
from pathlib import Path

from pydantic import ValidationError

from daemon.specd.api_models import RayNodeInfo, RayStatus
from daemon.specd.config import SpecdConfig
from daemon.specd.ray_command import ray_env
from daemon.specd.ray_node import RunningNode, failure_cause


def probe_address(config: SpecdConfig, node: RunningNode) -> str:
    # a head's GCS listens on every interface; dial it over loopback from its own node
    return f"127.0.0.1:{config.ray.port}" if node.role == "head" else node.gcs_address


def query_status(config: SpecdConfig, token_file: Path, node: RunningNode | None) -> RayStatus:
    if node is None:
        return RayStatus(running=False)
    status = RayStatus(
        running=True, role=node.role, gcs_address=node.gcs_address, labels=node.labels
    )
    command = [sys.executable, "-m", "daemon.specd.ray_probe", probe_address(config, node)]
    try:
        result = subprocess.run(
            command,
            env=ray_env(token_file),
            capture_output=True,
            text=True,
            timeout=config.ray.probe_timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        status.error = f"cluster query timed out after {config.ray.probe_timeout_s:g} s"
        return status
    if result.returncode != 0:
        status.error = f"cluster query failed: {failure_cause(result.stderr)}"
        return status
    try:
        nodes = json.loads(result.stdout.strip().splitlines()[-1])["nodes"]
        status.nodes = [RayNodeInfo.model_validate(item) for item in nodes]
    except (ValueError, IndexError, KeyError, ValidationError) as error:
        status.error = f"cluster query returned unreadable output: {error}"
    return status
