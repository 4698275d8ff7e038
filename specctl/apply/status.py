"""`specctl status`: what is deployed, where each shard runs, and how it is doing.

Read from what `apply` recorded (`state.json`, `server.json`), the serving process's
`/specctl/status` (the shards it watches: state and the node each reports running on) and the
metrics history in SQLite (the last minute). Never imports ray or torch; what cannot be read is
said in `problems`, never raised.
"""

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from db import MetricSample, Store, StoreError
from specctl.apply.state import AppliedState, StateError
from specctl.apply.watch_record import live_watch
from specctl.deploy.server_process import ServerRecord, ServerRecordError
from specctl.home import SpecctlHome

STATUS_ROUTE = "/specctl/status"
HTTP_TIMEOUT_S = 3.0
WINDOW_S = 60.0  # live figures: the last minute of samples


@dataclass(slots=True)
class ShardLine:
    id: str
    role: str
    replica: int
    node: str  # where the plan put it
    state: str  # loading | ready | failed | stopped | unreachable | unknown
    running_on: str | None = None  # the node the shard reports running on
    pid: int | None = None
    error: str | None = None


@dataclass(slots=True)
class LiveFigures:
    window_s: float
    num_samples: int
    tokens_per_s: float  # mean over the window
    busy_tokens_per_s: float | None  # mean over the seconds that generated tokens
    acceptance_rate: float | None  # mean over samples that drafted
    mean_acceptance_length: float | None
    ttft_p50_ms: float | None  # the newest sample that had one
    batch_size: int  # largest in the window
    k_in_use: float | None
    num_requests_running: int
    last_sample_age_s: float


@dataclass(slots=True)
class StatusReport:
    deployment: str | None = None
    config_path: str | None = None
    endpoint: str | None = None
    served_model_name: str | None = None
    server_pid: int | None = None
    is_server_alive: bool = False
    server_status: str | None = None  # loading | ready | failed | stopping (its own word)
    nodes: list[dict[str, str]] = field(default_factory=list)
    shards: list[ShardLine] = field(default_factory=list)
    live: LiveFigures | None = None
    watch: dict[str, Any] | None = None  # the `apply --watch` keeping it running (watch.json)
    problems: list[str] = field(default_factory=list)

    @property
    def is_healthy(self) -> bool:
        """Applied, serving, every shard ready, nothing wrong seen."""
        return (
            self.deployment is not None
            and not self.problems
            and self.is_server_alive
            and self.server_status == "ready"
            and all(s.state == "ready" for s in self.shards)
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "is_healthy": self.is_healthy}


def read_status(home: SpecctlHome) -> StatusReport:
    # the watch in every case: one in its first apply runs while nothing is applied yet
    watching = live_watch(home)
    watch = None if watching is None else asdict(watching)
    try:
        state = AppliedState.load(home.state_file)
    except StateError as exc:
        return StatusReport(problems=[str(exc)], watch=watch)
    if state is None:
        nothing = "nothing applied (run `specctl apply CLUSTER.toml`)"
        return StatusReport(problems=[nothing], watch=watch)
    report = StatusReport(
        deployment=state.deployment,
        config_path=state.config_path,
        endpoint=f"{state.server.url}/v1" if state.server else None,
        served_model_name=state.served_model_name,
        nodes=[{"name": n.name, "kind": n.kind, "address": n.address} for n in state.nodes],
        shards=[ShardLine(s.actor, s.role, s.replica, s.node, "unknown") for s in state.shards],
    )
    try:
        record = ServerRecord.load(home.server_file)
    except ServerRecordError as exc:
        record = None
        report.problems.append(str(exc))
    if record is None or not record.is_alive():
        report.problems.append("the serving process is not running (run `specctl apply` again)")
    else:
        report.server_pid, report.is_server_alive = record.pid, True
        _ask_server(report, record.url)
    report.live = _live(state, report.problems)
    report.watch = watch
    return report


def _ask_server(report: StatusReport, url: str) -> None:
    try:
        response = httpx.get(f"{url}{STATUS_ROUTE}", timeout=HTTP_TIMEOUT_S)
        response.raise_for_status()
        body: dict[str, Any] = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        report.problems.append(f"the serving process at {url} did not answer: {exc}")
        return
    report.server_status = body.get("status")
    watched = {s["id"]: s for s in body.get("shards", [])}
    for line in report.shards:
        seen = watched.get(line.id)
        if seen is not None:
            line.state, line.running_on = seen["state"], seen.get("running_on")
            line.pid, line.error = seen.get("pid"), seen.get("error")


def _live(state: AppliedState, problems: list[str]) -> LiveFigures | None:
    if not state.db_path or not state.deployment_id:
        return None
    now = time.time()
    try:
        with Store.open(state.db_path, role="reader") as store:
            samples = store.samples_since(state.deployment_id, now - WINDOW_S)
    except StoreError as exc:
        problems.append(f"metrics history unreadable: {exc}")
        return None
    try:
        return summarise(samples, now) if samples else None
    except (TypeError, ValueError) as exc:  # SQLite keeps what a writer put, of any type
        problems.append(f"metrics history unreadable: {state.db_path}: a damaged sample ({exc})")
        return None


def summarise(samples: list[MetricSample], now_unix_s: float) -> LiveFigures:
    drafted = [s for s in samples if s.acceptance_rate is not None]
    lengths = [s.mean_acceptance_length for s in drafted if s.mean_acceptance_length is not None]
    with_ttft = [s for s in samples if s.ttft_p50_ms is not None]
    busy = [s.tokens_per_s for s in samples if s.tokens_per_s > 0]
    with_k = [s.k_in_use for s in samples if s.k_in_use is not None]
    return LiveFigures(
        window_s=WINDOW_S,
        num_samples=len(samples),
        tokens_per_s=statistics.fmean(s.tokens_per_s for s in samples),
        busy_tokens_per_s=statistics.fmean(busy) if busy else None,
        acceptance_rate=statistics.fmean(s.acceptance_rate for s in drafted)  # type: ignore[misc]
        if drafted
        else None,
        mean_acceptance_length=statistics.fmean(lengths) if lengths else None,
        ttft_p50_ms=with_ttft[-1].ttft_p50_ms if with_ttft else None,
        batch_size=max(s.batch_size for s in samples),
        k_in_use=statistics.fmean(with_k) if with_k else None,
        num_requests_running=samples[-1].num_requests_running,
        last_sample_age_s=max(0.0, now_unix_s - samples[-1].time_unix_s),
    )
