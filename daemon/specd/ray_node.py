"""This node's Ray process: start as head or worker, stop, report. One instance per daemon;
a lock serialises start and stop, and a state file lets a restarted specd find the Ray node
it started before."""

import json
import logging
import subprocess
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from daemon.specd.address import is_reachable, parse_address
from daemon.specd.api_models import RayStartRequest
from daemon.specd.config import SpecdConfig
from daemon.specd.inventory import Inventory
from daemon.specd.labels import derived_labels
from daemon.specd.process_tree import end_session, session_pids
from daemon.specd.ray_command import head_command, ray_env, worker_command

logger = logging.getLogger(__name__)

STATE_FILE_NAME = "ray-node.json"
START_LOG_NAME = "ray-start.log"
ERROR_TAIL_CHARS = 2000


class RayNodeError(Exception):
    """A start or stop that cannot be done; carries the HTTP status and the request field."""

    def __init__(self, status_code: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.field = field


@dataclass(slots=True)
class RunningNode:
    role: str
    gcs_address: str  # host:port of the cluster's GCS, as other processes should dial it
    labels: dict[str, str]
    session_id: int  # session of the `ray start` process: every Ray process of this node


class RayNode:
    def __init__(
        self, config: SpecdConfig, token_file: Path, inventory: Callable[[], Inventory]
    ) -> None:
        self._config = config
        self._token_file = token_file
        self._inventory = inventory
        self._lock = threading.Lock()
        self._state_file = Path(config.state_dir) / STATE_FILE_NAME
        self._running = self._adopt()

    @property
    def running(self) -> RunningNode | None:
        with self._lock:
            return self._running if self._is_alive(self._running) else None

    def start(self, request: RayStartRequest) -> tuple[RunningNode, bool]:
        """Start Ray as asked; (node, False) when it already runs exactly so (a no-op)."""
        with self._lock:
            if self._is_alive(self._running):
                return self._same_or_conflict(request), False
            node = self._start_locked(request)
            self._running = node
            self._save(node)
            return node, True

    def stop(self) -> tuple[bool, list[int]]:
        """Stop every process of this node's Ray; (was_running, pids that would not die)."""
        with self._lock:
            node, self._running = self._running, None
            self._state_file.unlink(missing_ok=True)
            if node is None:
                return False, []
            leftover = end_session(node.session_id, self._config.ray.stop_grace_s)
            logger.info("ray stopped (session %d, %d left over)", node.session_id, len(leftover))
            return True, leftover

    def _same_or_conflict(self, request: RayStartRequest) -> RunningNode:
        node = self._running
        assert node is not None
        same_address = request.role == "head" or request.address == node.gcs_address
        if request.role != node.role or not same_address:
            raise RayNodeError(
                409,
                f"Ray already runs here as {node.role} of {node.gcs_address}; "
                "POST /v1/ray/stop first",
                "role",
            )
        return node

    def _start_locked(self, request: RayStartRequest) -> RunningNode:
        ray = self._config.ray
        labels = {**derived_labels(self._inventory()), **request.labels}
        temp_dir = self._config.ray_temp_dir
        temp_dir.mkdir(parents=True, exist_ok=True)
        if request.role == "head":
            if is_reachable("127.0.0.1", ray.port, ray.head_connect_timeout_s):
                raise RayNodeError(409, f"ray.port {ray.port} is already in use on this node")
            command = head_command(ray, temp_dir, self._config.node_name, labels)
            gcs_address = f"{ray.node_ip_address or '127.0.0.1'}:{ray.port}"
        else:
            assert request.address is not None
            self._check_head(request.address)
            command = worker_command(ray, request.address, temp_dir, self._config.node_name, labels)
            gcs_address = request.address
        session_id = self._run_ray_start(command)
        logger.info("ray started as %s of %s (session %d)", request.role, gcs_address, session_id)
        return RunningNode(request.role, gcs_address, labels, session_id)

    def _check_head(self, address: str) -> None:
        host, port = parse_address(address)
        if not is_reachable(host, port, self._config.ray.head_connect_timeout_s):
            raise RayNodeError(
                400,
                f"Ray head {address} is unreachable: no TCP connection within "
                f"{self._config.ray.head_connect_timeout_s:g} s",
                "address",
            )

    def _run_ray_start(self, command: list[str]) -> int:
        log_path = Path(self._config.state_dir) / START_LOG_NAME
        with log_path.open("w") as log:
            process = subprocess.Popen(
                command,
                env=ray_env(self._token_file),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its session id then marks every Ray process it forks
            )
            try:
                code = process.wait(timeout=self._config.ray.start_timeout_s)
            except subprocess.TimeoutExpired:
                end_session(process.pid, self._config.ray.stop_grace_s)
                process.wait(timeout=self._config.ray.stop_grace_s)
                raise RayNodeError(
                    504, f"ray start did not finish in {self._config.ray.start_timeout_s:g} s"
                ) from None
        if code != 0:
            end_session(process.pid, self._config.ray.stop_grace_s)
            tail = log_path.read_text(errors="replace")[-ERROR_TAIL_CHARS:]
            raise RayNodeError(502, f"ray start failed (exit code {code}):\n{tail}")
        return process.pid

    def _is_alive(self, node: RunningNode | None) -> bool:
        if node is None:
            return False
        marker = str(self._config.ray_temp_dir)
        for pid in session_pids(node.session_id):
            try:
                if marker in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                    return True
            except OSError:
                continue
        return False

    def _save(self, node: RunningNode) -> None:
        self._state_file.write_text(json.dumps(asdict(node)))

    def _adopt(self) -> RunningNode | None:
        try:
            node = RunningNode(**json.loads(self._state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None
        if not self._is_alive(node):
            self._state_file.unlink(missing_ok=True)
            return None
        logger.info("found Ray started earlier (session %d)", node.session_id)
        return node
