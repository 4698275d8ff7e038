"""Opening the store file: checks that it is a specctl store, the pragmas, the two roles.

The writer (the serving process; `specctl apply` for deployment rows) waits up to 5 s for the
write lock and takes it at the start of every transaction (`BEGIN IMMEDIATE`), so a write never
fails half-way on a lock upgrade. Readers (the TUI, `specctl status`) open the file read-only
and wait at most 250 ms: a missed refresh beats a frozen window. WAL mode lets readers read
while the writer writes.
"""

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from db.errors import StoreBusyError, StoreError
from db.migrations import APPLICATION_ID, CURRENT_VERSION, apply_migrations, schema_version

Role = Literal["writer", "reader"]

WRITER_BUSY_TIMEOUT_MS = 5000
READER_BUSY_TIMEOUT_MS = 250
WAL_SIZE_LIMIT_BYTES = 16 * 2**20  # the WAL file is truncated to this after a checkpoint


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    path: Path
    role: Role
    busy_timeout_ms: int

    def connect(self) -> sqlite3.Connection:
        """A new connection in autocommit mode (transactions are begun explicitly)."""
        if self.role == "reader":
            uri = f"file:{_quote_uri_path(self.path)}?mode=ro"
        else:
            uri = f"file:{_quote_uri_path(self.path)}?mode=rwc"
        connection = sqlite3.connect(
            uri,
            uri=True,
            timeout=self.busy_timeout_ms / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        connection.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
        if self.role == "writer":
            connection.execute("PRAGMA synchronous = NORMAL")  # safe in WAL mode
            connection.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT_BYTES}")
        return connection


def _quote_uri_path(path: Path) -> str:
    return str(path.resolve()).replace("%", "%25").replace("?", "%3f").replace("#", "%23")


def settings_for(path: Path, role: Role, busy_timeout_ms: int | None = None) -> ConnectionSettings:
    if busy_timeout_ms is None:
        busy_timeout_ms = WRITER_BUSY_TIMEOUT_MS if role == "writer" else READER_BUSY_TIMEOUT_MS
    if busy_timeout_ms < 0:
        raise ValueError(f"busy_timeout_ms must be >= 0, got {busy_timeout_ms}")
    return ConnectionSettings(path=path, role=role, busy_timeout_ms=busy_timeout_ms)


def prepare_store(settings: ConnectionSettings) -> int:
    """Check the file and bring its schema up to date (writer) or check it is (reader).

    Returns the schema version the file had when opened. Raises StoreError saying what is wrong
    with the file or its location.
    """
    path = settings.path
    if settings.role == "reader":
        if not path.exists():
            raise StoreError(f"{path}: no store here yet (the serving process creates it)")
    else:
        _check_writable_location(path)
    try:
        connection = settings.connect()
    except sqlite3.Error as error:
        raise _open_error(path, error) from None
    try:
        return _prepare(connection, settings)
    except sqlite3.DatabaseError as error:
        raise _open_error(path, error) from None
    finally:
        connection.close()


def _prepare(connection: sqlite3.Connection, settings: ConnectionSettings) -> int:
    path = settings.path
    application_id = int(connection.execute("PRAGMA application_id").fetchone()[0])
    num_tables = connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    version = schema_version(connection)
    is_fresh = application_id == 0 and num_tables == 0 and version == 0
    if not is_fresh and application_id != APPLICATION_ID:
        raise StoreError(
            f"{path}: a SQLite database, but not a specctl store "
            f"(application_id {application_id:#x}, expected {APPLICATION_ID:#x}); "
            "point SPECCTL_HOME at another directory"
        )
    if version > CURRENT_VERSION:
        raise StoreError(
            f"{path}: store schema v{version} was written by a newer specctl; "
            f"this one knows up to v{CURRENT_VERSION} (upgrade specctl, or use another file)"
        )
    if settings.role == "reader":
        if is_fresh:
            raise StoreError(f"{path}: empty file, not a specctl store yet (a writer creates one)")
        if version < CURRENT_VERSION:
            raise StoreError(
                f"{path}: store schema v{version} is older than v{CURRENT_VERSION}; "
                "the serving process (or any `specctl apply`) upgrades it when it opens it"
            )
        return version
    if is_fresh:
        # both must precede the first table: auto_vacuum lets retention hand pages back
        connection.execute("PRAGMA auto_vacuum = INCREMENTAL")
        connection.execute("PRAGMA journal_mode = WAL")
    elif connection.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        connection.execute("PRAGMA journal_mode = WAL")
    return apply_migrations(connection)


def _check_writable_location(path: Path) -> None:
    parent = path.parent
    if not parent.is_dir():
        raise StoreError(
            f"{path}: directory {parent} does not exist (create it, or set SPECCTL_HOME)"
        )
    if path.is_dir():
        raise StoreError(f"{path}: is a directory, not a store file")
    target = path if path.exists() else parent
    if not os.access(target, os.W_OK):
        raise StoreError(f"{path}: {_readonly_reason(target)}; the writer needs to write there")


def _readonly_reason(target: Path) -> str:
    kind = "directory" if target.is_dir() else "file"
    return f"{kind} {target} is read-only for this user"


def _open_error(path: Path, error: sqlite3.Error) -> StoreError:
    text = str(error)
    if "file is not a database" in text or "malformed" in text:
        return StoreError(
            f"{path}: not a specctl store (not a SQLite database, or a damaged one: {text})"
        )
    if "readonly" in text or "unable to open" in text:
        return StoreError(f"{path}: cannot write here ({text}); the writer needs a writable place")
    if "locked" in text or "busy" in text:
        return StoreBusyError(f"{path}: store busy (locked by another process: {text}); try again")
    return StoreError(f"{path}: cannot use the store: {text}")
