"""This node's Ray process: start as head or worker, stop, report. One instance per daemon;
a lock serialises start and stop, and a state file lets a restarted specd find the Ray node
it started before."""

import contextlib
import json
import logging
import os
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from daemon.cluster_token import TokenError, read_token
from daemon.specd.address import is_reachable, parse_address, same_address
from daemon.specd.api_models import RayStartRequest
from daemon.specd.config import SpecdConfig
from daemon.specd.inventory import Inventory
from daemon.specd.labels import derived_labels
from daemon.specd.process_tree import end_session, process_argv, session_pids
from daemon.specd.ray_command import head_command, ray_env, worker_command

logger = logging.getLogger(__name__)

STATE_FILE_NAME = "ray-node.json"
START_LOG_NAME = "ray-start.log"
RAY_ADDRESS_FILE = "ray_current_cluster"  # where `ray start` writes the GCS address it gives
MAX_CAUSE_CHARS = 300  # of the line of a failed `ray start`'s log said in the response
LOCK_WAIT_S = 1.0  # a start or stop waits this long for one in progress, then 409
# the executables (argv[0]'s name) without which a Ray node is dead
WORKER_PROCESSES = ("raylet",)
HEAD_PROCESSES = ("raylet", "gcs_server")


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
        self,
        config: SpecdConfig,
        token_file: Path,
        inventory: Callable[[], Inventory],
        token: str | None = None,
    ) -> None:
        """token: what the API checks, read at start-up; a `ray start` refuses a token file
        that no longer holds it (None: not checked)."""
        self._config = config
        self._token_file = token_file
        self._token = token
        self._inventory = inventory
        self._lock = threading.Lock()
        self._state_file = Path(config.state_dir) / STATE_FILE_NAME
        self._running = self._adopt()

    @property
    def running(self) -> RunningNode | None:
        """The node, if its processes live. Read without the lock: a status must not wait
        out a start (a start waits up to start_timeout_s for `ray start`, and every status
        of a polling TUI queued behind it took the thread pool, /health included)."""
        node = self._running
        return node if self._is_alive(node) else None

    def start(self, request: RayStartRequest) -> tuple[RunningNode, bool]:
        """Start Ray as asked; (node, False) when it already runs exactly so (a no-op)."""
        with self._locked("start"):
            if self._is_alive(self._running):
                return self._same_or_conflict(request), False
            self._end_dead()
            self._check_token()
            node = self._start_locked(request)
            self._running = node
            self._save(node)
            return node, True

    def stop(self) -> tuple[bool, list[int]]:
        """Stop every process of this node's Ray; (was_running, pids that would not die)."""
        with self._locked("stop"):
            node, self._running = self._running, None
            if node is None:
                self._state_file.unlink(missing_ok=True)
                return False, []
            leftover = end_session(node.session_id, self._config.ray.stop_grace_s)
            logger.info("ray stopped (session %d, %d left over)", node.session_id, len(leftover))
            if leftover:  # kept, so that a second stop tries them again
                self._running = node
            else:
                self._state_file.unlink(missing_ok=True)
            return True, leftover

    @contextlib.contextmanager
    def _locked(self, what: str) -> Iterator[None]:
        """The start/stop lock, or a 409 within LOCK_WAIT_S: requests queued behind a start
        that hung ran one after another long after their clients gave up."""
        if not self._lock.acquire(timeout=LOCK_WAIT_S):
            raise RayNodeError(409, f"a Ray start or stop is in progress here; {what} again later")
        try:
            yield
        finally:
            self._lock.release()

    def _check_token(self) -> None:
        """The token file `ray start` will read holds the token the API checks: a file
        replaced since specd started (`specctl init --force`) guarded Ray with another secret,
        and one holding anything at all was handed to Ray as it was."""
        try:
            current = read_token(self._token_file)
        except TokenError as exc:
            raise RayNodeError(409, str(exc)) from None
        if self._token is not None and current != self._token:
            raise RayNodeError(
                409,
                f"{self._token_file}: the token changed since specd started; restart specd so "
                "that its API and Ray check the same one",
            )

    def _same_or_conflict(self, request: RayStartRequest) -> RunningNode:
        node = self._running
        assert node is not None
        same_head = request.role == "head" or (
            request.address is not None and same_address(request.address, node.gcs_address)
        )
        if request.role != node.role or not same_head:
            raise RayNodeError(
                409,
                f"Ray already runs here as {node.role} of {node.gcs_address}; "
                "POST /v1/ray/stop first",
                "role",
            )
        # labels asked for must be the node's (a start with other labels answered "already
        # running as asked" and dropped them); labels not asked about are no difference
        differ = {k: v for k, v in request.labels.items() if node.labels.get(k) != v}
        if differ:
            raise RayNodeError(
                409,
                f"Ray already runs here without labels {differ} (a running node's labels do "
                "not change): POST /v1/ray/stop first",
                "labels",
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
        node = RunningNode(request.role, gcs_address, labels, 0)
        self._run_ray_start(command, node)
        if request.role == "head" and not ray.node_ip_address:
            node.gcs_address = advertised_gcs_address(temp_dir, ray.port) or gcs_address
        logger.info(
            "ray started as %s of %s (session %d)", node.role, node.gcs_address, node.session_id
        )
        return node

    def _check_head(self, address: str) -> None:
        host, port = parse_address(address)
        if not is_reachable(host, port, self._config.ray.head_connect_timeout_s):
            raise RayNodeError(
                400,
                f"Ray head {address} is unreachable: no TCP connection within "
                f"{self._config.ray.head_connect_timeout_s:g} s",
                "address",
            )

    def _run_ray_start(self, command: list[str], node: RunningNode) -> None:
        """Run `ray start`; `node.session_id` is its session, recorded in the state file at
        once: a specd killed while `ray start` ran left a Ray node no restart could find."""
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
            node.session_id = process.pid
            try:
                self._save(node)
            except OSError:  # no record, no node: a Ray nobody could find or stop
                end_session(process.pid, self._config.ray.stop_grace_s)
                process.wait(timeout=self._config.ray.stop_grace_s)
                raise
            try:
                code = process.wait(timeout=self._config.ray.start_timeout_s)
            except subprocess.TimeoutExpired:
                end_session(process.pid, self._config.ray.stop_grace_s)
                process.wait(timeout=self._config.ray.stop_grace_s)
                self._state_file.unlink(missing_ok=True)
                raise RayNodeError(
                    504, f"ray start did not finish in {self._config.ray.start_timeout_s:g} s"
                ) from None
        if code != 0:
            end_session(process.pid, self._config.ray.stop_grace_s)
            self._state_file.unlink(missing_ok=True)
            text = log_path.read_text(errors="replace")
            logger.warning("ray start failed (exit code %d); its output:\n%s", code, text[-4000:])
            raise RayNodeError(
                502, f"ray start failed (exit code {code}): {failure_cause(text)} (log: {log_path})"
            )

    def _is_alive(self, node: RunningNode | None) -> bool:
        """Whether the node's raylet lives (and a head's GCS server): the processes without
        which it is no node. Any process of its session with the temp dir in its command line
        counted before, and Ray's log monitor outlives a raylet killed under it: a node whose
        raylet had died was reported running, a start was a no-op, and apply waited out its
        whole timeout for shards that could never be placed there."""
        if node is None:
            return False
        needed = set(HEAD_PROCESSES if node.role == "head" else WORKER_PROCESSES)
        return needed <= set(self._remnants(node).values())

    def _end_dead(self) -> None:
        """End what is left of a node found dead (its log monitor, a head's GCS, ...) before
        another starts: it holds the node's ports and writes into its temp dir."""
        node, self._running = self._running, None
        if node is None:
            return
        found = len(self._remnants(node))
        if not found:
            self._state_file.unlink(missing_ok=True)
            return
        leftover = end_session(node.session_id, self._config.ray.stop_grace_s)
        logger.warning(
            "ray (session %d) found dead, its raylet or GCS gone: %d process(es) of it left, "
            "%d would not die; starting anew",
            node.session_id,
            found,
            len(leftover),
        )
        if leftover:  # they may hold its ports: the start would fail on them
            self._running = node
            raise RayNodeError(
                500,
                f"ray (session {node.session_id}) is dead but pids "
                f"{', '.join(map(str, leftover))} of it would not die",
            )
        self._state_file.unlink(missing_ok=True)
        # where a dead head wrote its GCS address: `ray start --head` on the same port reads
        # it and refuses, "already running" (a clean stop removes it)
        (self._config.ray_temp_dir / RAY_ADDRESS_FILE).unlink(missing_ok=True)

    def _save(self, node: RunningNode) -> None:  # written whole: a reader never sees half
        tmp = self._state_file.with_name(f".{self._state_file.name}.tmp")
        tmp.write_text(json.dumps(asdict(node)))
        os.replace(tmp, self._state_file)

    def _adopt(self) -> RunningNode | None:
        try:
            node = RunningNode(**json.loads(self._state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None
        if self._is_alive(node):
            logger.info("found Ray started earlier (session %d)", node.session_id)
            return node
        if self._remnants(node):  # kept, for the next start or stop to end
            logger.info("found Ray started earlier (session %d) dead", node.session_id)
            return node
        self._state_file.unlink(missing_ok=True)
        return None

    def _remnants(self, node: RunningNode) -> dict[int, str]:
        """The node's processes still running, pid -> executable name (its session's, with
        its temp dir in their command line: a session id outlives a reboot, and another
        program may have it)."""
        marker = str(self._config.ray_temp_dir)
        found: dict[int, str] = {}
        for pid in session_pids(node.session_id):
            argv = process_argv(pid)
            if argv and any(marker in a for a in argv[1:]):
                found[pid] = Path(argv[0]).name
        return found


def failure_cause(output: str) -> str:
    """One line saying why a command failed, from its output: the last exception line of a
    traceback ("ValueError: ..."), else its last line; never the traceback itself."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if _EXCEPTION_LINE.match(line)]
    cause = errors[-1] if errors else (lines[-1] if lines else "no output")
    return cause[:MAX_CAUSE_CHARS]


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b.*:")


def advertised_gcs_address(temp_dir: Path, port: int) -> str | None:
    """The GCS address a `ray start --head` with this temp dir wrote to its
    `ray_current_cluster` file: host:port as Ray advertises the head to other nodes (the node
    IP it found: the address this machine routes off it from, loopback where nothing routes
    off it). None where the file is missing or names another port. Given as 127.0.0.1:port,
    as it was, a head's address told a node on another machine to dial its own loopback: it
    joined only with `ray.node_ip_address` set."""
    path = temp_dir / RAY_ADDRESS_FILE
    try:
        text = path.read_text().strip()
        _, found_port = parse_address(text)
    except (OSError, ValueError) as exc:
        logger.warning("no GCS address in %s (%s): giving the head as 127.0.0.1", path, exc)
        return None
    if found_port != port:
        logger.warning("%s names port %d, not ray.port %d: ignored", path, found_port, port)
        return None
    return text
