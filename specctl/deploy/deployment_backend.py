"""The serving process of an applied deployment: join its Ray cluster, reach every replica's
verifier shard by name, and put them behind one backend (a router when there are several).
Also keeps an eye on the shards, for `specctl status` and the TUI."""

import logging
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specctl.apply.state import AppliedState, StateError
from specctl.deploy.actors import ask_statuses, find_actor, first_line
from specctl.deploy.ray_connect import connect
from specctl.deploy.remote_backend import RemoteBackend, served_model
from specctl.deploy.router import RouterBackend
from specctl.server.backend import EngineBackend

logger = logging.getLogger(__name__)

SHARD_LOAD_TIMEOUT_S = 600.0
WATCH_INTERVAL_S = 2.0
STATUS_CALL_TIMEOUT_S = 5.0


class DeploymentError(Exception):
    """The deployment's shards cannot be reached; the message says which."""


def read_deployment(state_file: Path) -> AppliedState:
    try:
        state = AppliedState.load(state_file)
    except StateError as exc:
        raise DeploymentError(str(exc)) from None
    if state is None:
        raise DeploymentError(f"{state_file}: no deployment applied; run `specctl apply`")
    if not state.verifier_actors():
        raise DeploymentError(f"{state_file}: the deployment has no verifier shard")
    return state


def connect_deployment(state: AppliedState) -> None:
    """Join the deployment's Ray cluster as a driver (raises RayConnectError)."""
    connect(state.ray_address, Path(state.token_file))


def deployment_backend(
    state: AppliedState, load_timeout_s: float = SHARD_LOAD_TIMEOUT_S
) -> EngineBackend:
    """Every replica's verifier shard, reached by name once loaded; a router over them when
    there are several. Call after `connect_deployment`."""
    backends: list[EngineBackend] = []
    for actor in state.verifier_actors():
        handle = find_actor(actor)
        if handle is None:
            raise DeploymentError(f"verifier shard {actor} is not running; run `specctl apply`")
        model = served_model(handle, state.served_model_name, timeout_s=load_timeout_s)
        backends.append(RemoteBackend(handle, model, actor_name=actor))
    return backends[0] if len(backends) == 1 else RouterBackend(backends)


@dataclass(slots=True)
class ShardReport:
    id: str  # the actor name
    role: str
    replica: int
    node: str  # where the plan put it
    state: str  # loading | ready | failed | stopped | unreachable
    running_on: str | None = None  # the node it reports running on
    pid: int | None = None
    error: str | None = None
    checked_unix_s: float = 0.0


# the shards a replica cannot answer without (a drafter down only slows it)
SERVING_ROLES = ("verifier", "stage")


class ShardWatcher:
    """Asks every shard for its status every few seconds, on a thread of its own."""

    def __init__(self, state: AppliedState, interval_s: float = WATCH_INTERVAL_S) -> None:
        self._state = state
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._reports = [
            ShardReport(s.actor, s.role, s.replica, s.node, "unknown") for s in state.shards
        ]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shard-watch", daemon=True)

    def start(self) -> None:
        """Look once now, then every interval on the thread: a status read just after the
        server said ready found every shard "unknown" (not looked at yet), and exited 3."""
        fresh = self._look(self._reports)
        with self._lock:
            self._reports = fresh
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def reports(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(r) for r in self._reports]

    def serving_problem(self) -> str | None:
        """Why no replica can serve, from the latest look (None: one can, or none was looked
        at yet). A replica serves while its verifier and pipeline stages are ready; a
        drafter down only slows it (the verifier decodes on its own meanwhile)."""
        with self._lock:
            reports = list(self._reports)
        by_replica: dict[int, list[ShardReport]] = {}
        for report in reports:
            if report.role in SERVING_ROLES:
                by_replica.setdefault(report.replica, []).append(report)
        broken: list[str] = []
        for shards in by_replica.values():
            down = [r for r in shards if r.state not in ("ready", "unknown")]
            if not down:
                return None
            broken += [f"{r.id} {r.state}" + (f" ({r.error})" if r.error else "") for r in down]
        return "no replica can serve: " + "; ".join(broken) if broken else None

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            fresh = self._look(self._reports)
            with self._lock:
                self._reports = fresh

    def _look(self, reports: list[ShardReport]) -> list[ShardReport]:
        """Every shard asked at once (the first look is made before the server says ready)."""
        now = time.time()
        fresh: list[ShardReport] = []
        handles: dict[str, Any] = {}
        for report in reports:
            out = ShardReport(report.id, report.role, report.replica, report.node, "unreachable")
            out.checked_unix_s = now
            fresh.append(out)
            try:
                handle = find_actor(report.id)
            except Exception as exc:
                out.error = first_line(exc)
                continue
            if handle is None:
                out.error = "no such actor"
            else:
                handles[report.id] = handle
        answers = ask_statuses(handles, STATUS_CALL_TIMEOUT_S)
        for out in fresh:
            status = answers.get(out.id)
            if isinstance(status, Exception):
                out.error = first_line(status)
            elif status is not None:
                out.state, out.running_on, out.pid, out.error = (
                    status.state,
                    status.node_name,
                    status.pid,
                    status.error,
                )
        return fresh
