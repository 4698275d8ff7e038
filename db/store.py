"""The specctl store: one SQLite file, one writer, many readers.

    store = Store.open(home / "specctl.db", role="writer")   # the serving process, apply
    store.write(WriteBatch(metric_samples=[...]))              # one transaction, once a second
    view = Store.open(home / "specctl.db", role="reader")     # the TUI, `specctl status`
    view.samples_since(deployment_id, time.time() - 300)      # raises StoreBusyError, never hangs

Every method opens a short transaction of its own; a Store may be used from several threads.
"""

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import QueuePool
from sqlmodel import Session

from db import reads, writes
from db.connection import ConnectionSettings, Role, prepare_store, settings_for
from db.errors import StoreBusyError, StoreError
from db.retention import RetentionPolicy, TrimReport, trim
from db.tables import (
    DEPLOYMENT_STATUSES,
    DeploymentRow,
    GpuRow,
    GpuSample,
    MetricSample,
    NodeRow,
    RequestRecord,
)
from db.writes import WriteBatch

T = TypeVar("T")

POOL_TIMEOUT_S = 5.0
DEFAULT_READ_LIMIT = 3600  # rows a history query returns at most (an hour of 1 Hz samples)


class Store:
    def __init__(self, settings: ConnectionSettings, retention: RetentionPolicy) -> None:
        """Use Store.open(), which checks and migrates the file first."""
        self.path = settings.path
        self.role: Role = settings.role
        self.retention = retention
        self._settings = settings
        self._engine = _make_engine(settings.connect, settings.role)
        self._last_trim_monotonic_s = time.monotonic()
        self.found_schema_version = 0  # the version the file had when opened (before migrating)

    @classmethod
    def open(
        cls,
        path: Path | str,
        role: Role = "reader",
        retention: RetentionPolicy | None = None,
        busy_timeout_ms: int | None = None,
    ) -> "Store":
        """Open the store at `path`. A writer creates the file, or migrates it to the current
        schema; a reader needs an existing, current one. Raises StoreError naming the file.

        `busy_timeout_ms` overrides the role's wait for a lock (writer 5000, reader 250)."""
        if role not in ("writer", "reader"):
            raise ValueError(f"role must be 'writer' or 'reader', got {role!r}")
        settings = settings_for(Path(path).expanduser(), role, busy_timeout_ms)
        found = prepare_store(settings)
        store = cls(settings, retention or RetentionPolicy())
        store.found_schema_version = found
        return store

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- writing (role "writer") ----

    def write(self, batch: WriteBatch, now_unix_s: float | None = None) -> None:
        """Write the batch in one IMMEDIATE transaction; trim history when it is time to."""
        self._check_writer()
        if batch.num_rows:
            self._write(lambda connection: writes.write_batch(connection, batch))
        if time.monotonic() - self._last_trim_monotonic_s >= self.retention.trim_interval_s:
            self.trim(now_unix_s)

    def add_deployment(self, row: DeploymentRow) -> int:
        """Record an applied deployment; returns its id (for samples and requests)."""
        _check_status(row.status)
        return self._write(lambda connection: writes.add_deployment(connection, row))

    def set_deployment_status(
        self,
        deployment_id: int,
        status: str,
        message: str | None = None,
        endpoint: str | None = None,
    ) -> None:
        _check_status(status)
        found = self._write(
            lambda connection: writes.set_deployment_status(
                connection, deployment_id, status, message, endpoint
            )
        )
        if not found:
            raise StoreError(f"{self.path}: no deployment with id {deployment_id}")

    def trim(self, now_unix_s: float | None = None) -> TrimReport:
        """Apply the retention policy now, then hand freed pages back to the file system."""
        now = time.time() if now_unix_s is None else now_unix_s
        report = self._write(lambda connection: trim(connection, self.retention, now))
        self._last_trim_monotonic_s = time.monotonic()
        if report.total:
            self._write(_incremental_vacuum)
        return report

    # ---- reading (either role) ----

    def latest_deployment(self) -> DeploymentRow | None:
        return self._read(reads.latest_deployment)

    def deployment(self, deployment_id: int) -> DeploymentRow | None:
        return self._read(lambda session: reads.deployment(session, deployment_id))

    def deployments(self, limit: int = 20) -> list[DeploymentRow]:
        return self._read(lambda session: reads.deployments(session, limit))

    def latest_sample(self, deployment_id: int) -> MetricSample | None:
        return self._read(lambda session: reads.latest_sample(session, deployment_id))

    def samples_since(
        self, deployment_id: int, since_unix_s: float, limit: int = DEFAULT_READ_LIMIT
    ) -> list[MetricSample]:
        """Samples of the deployment from `since_unix_s` on, oldest first (for sparklines)."""
        return self._read(
            lambda session: reads.samples_since(session, deployment_id, since_unix_s, limit)
        )

    def recent_samples(
        self, deployment_id: int, minutes: float = 5.0, now_unix_s: float | None = None
    ) -> list[MetricSample]:
        """The last `minutes` of samples, oldest first: a sparkline's worth."""
        now = time.time() if now_unix_s is None else now_unix_s
        return self.samples_since(deployment_id, now - minutes * 60.0)

    def recent_requests(
        self, deployment_id: int | None = None, limit: int = 50
    ) -> list[RequestRecord]:
        return self._read(lambda session: reads.recent_requests(session, deployment_id, limit))

    def nodes(self) -> list[NodeRow]:
        return self._read(reads.nodes)

    def gpus(self) -> list[GpuRow]:
        return self._read(reads.gpus)

    def gpu_samples_since(
        self, since_unix_s: float, node_name: str | None = None, limit: int = DEFAULT_READ_LIMIT
    ) -> list[GpuSample]:
        return self._read(
            lambda session: reads.gpu_samples_since(session, since_unix_s, node_name, limit)
        )

    # ---- transactions ----

    def _check_writer(self) -> None:
        if self.role != "writer":
            raise StoreError(f"{self.path}: opened as a reader; writing needs role='writer'")

    def _write(self, work: Callable[[Connection], T]) -> T:
        self._check_writer()
        with self._errors_named(), self._engine.begin() as connection:
            return work(connection)

    def _read(self, query: Callable[[Session], T]) -> T:
        with self._errors_named(), Session(self._engine, expire_on_commit=False) as session:
            try:
                result = query(session)
            except ValueError as error:  # a JSON column that is not JSON: a damaged row
                raise StoreError(f"{self.path}: a damaged row ({error})") from None
            session.commit()  # ends the read transaction (its snapshot) at once
            return result

    @contextmanager
    def _errors_named(self) -> Iterator[None]:
        try:
            yield
        except DBAPIError as error:
            raise _store_error(self._settings, error) from None
        except sqlite3.Error as error:
            raise StoreError(f"{self.path}: {error}") from None


def _check_status(status: str) -> None:
    if status not in DEPLOYMENT_STATUSES:
        raise ValueError(f"deployment status must be one of {DEPLOYMENT_STATUSES}, got {status!r}")


def _store_error(settings: ConnectionSettings, error: DBAPIError) -> StoreError:
    text = str(error.orig)
    if "locked" in text or "busy" in text:
        return StoreBusyError(
            f"{settings.path}: store busy (still locked after {settings.busy_timeout_ms} ms);"
            " try again"
        )
    return StoreError(f"{settings.path}: {text}")


def _incremental_vacuum(connection: Connection) -> None:
    # stepped to the end on the driver's cursor: each step frees pages (SQLAlchemy would stop
    # after the first, the statement having no result columns)
    cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
    cursor.execute("PRAGMA incremental_vacuum").fetchall()
    cursor.close()


def _make_engine(connect: Callable[[], sqlite3.Connection], role: Role) -> Engine:
    engine = create_engine(
        "sqlite://",
        creator=connect,
        poolclass=QueuePool,  # a connection per thread in use, reused; file-backed, not memory
        pool_size=2,
        max_overflow=6,
        pool_timeout=POOL_TIMEOUT_S,
    )
    begin_sql = "BEGIN IMMEDIATE" if role == "writer" else "BEGIN"

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        # the driver is in autocommit mode; every transaction starts here, explicitly
        connection.exec_driver_sql(begin_sql)

    return engine
