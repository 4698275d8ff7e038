"""The Dashboard's reading of the store: the latest deployment, its metric samples over the
last minutes, GPU readings per node and the newest requests, in one `DashboardReading`.

`DashboardReader.read()` never raises and never waits more than the store's reader timeout
(250 ms): a missing file, a locked one or a broken one comes back as a reading whose `state`
says so, carrying the last data that was read (a missed refresh beats a frozen window).
"""

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from db import (
    DeploymentRow,
    GpuSample,
    MetricSample,
    RequestRecord,
    Store,
    StoreBusyError,
    StoreError,
)

StoreState = Literal["ok", "missing", "busy", "error"]
NUM_RECENT_REQUESTS = 20  # the Dashboard's table shows up to this many
GPU_WINDOW_S = 30.0  # a GPU reading older than this is not "now"


@dataclass(frozen=True, slots=True)
class DashboardData:
    deployment: DeploymentRow | None = None
    samples: tuple[MetricSample, ...] = ()  # oldest first
    gpu_latest: tuple[GpuSample, ...] = ()  # the newest reading of each (node, gpu)
    requests: tuple[RequestRecord, ...] = ()  # newest first
    read_unix_s: float = 0.0

    @property
    def latest(self) -> MetricSample | None:
        return self.samples[-1] if self.samples else None


@dataclass(frozen=True, slots=True)
class DashboardReading:
    state: StoreState
    message: str  # what is wrong with the store ("" when nothing is)
    data: DashboardData = field(default_factory=DashboardData)


def latest_per_gpu(samples: list[GpuSample]) -> tuple[GpuSample, ...]:
    newest: dict[tuple[str, int], GpuSample] = {}
    for sample in samples:  # oldest first: later ones replace earlier ones
        newest[(sample.node_name, sample.gpu_index)] = sample
    return tuple(newest[key] for key in sorted(newest))


class DashboardReader:
    """Reads the store at `path` each time it is asked; keeps the store open in between and
    what it read last. Used from one worker thread at a time."""

    def __init__(self, path: Path, window_minutes: float) -> None:
        self.path = path
        self.window_minutes = window_minutes
        self._store: Store | None = None
        self._last = DashboardData()

    def read(self, now_unix_s: float | None = None) -> DashboardReading:
        now = time.time() if now_unix_s is None else now_unix_s
        try:
            store = self._open()
            data = self._query(store, now)
        except StoreBusyError as error:
            return DashboardReading("busy", f"{error} (showing the last reading)", self._last)
        except StoreError as error:
            self.close()
            state: StoreState = "missing" if not self.path.exists() else "error"
            return DashboardReading(state, str(error), self._last)
        self._last = data
        return DashboardReading("ok", "", data)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def _open(self) -> Store:
        if self._store is None:
            self._store = Store.open(self.path, role="reader")
        return self._store

    def _query(self, store: Store, now: float) -> DashboardData:
        deployment = store.latest_deployment()
        if deployment is None or deployment.id is None:
            return DashboardData(read_unix_s=now)
        samples = store.recent_samples(deployment.id, self.window_minutes, now)
        gpus = store.gpu_samples_since(now - GPU_WINDOW_S)
        requests = store.recent_requests(deployment.id, NUM_RECENT_REQUESTS)
        return DashboardData(deployment, tuple(samples), latest_per_gpu(gpus), tuple(requests), now)
