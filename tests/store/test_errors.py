"""Files and places that are not a usable store each give a StoreError naming the file."""

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from db import CURRENT_VERSION, Store, StoreBusyError, StoreError, WriteBatch

from .helpers import deployment_row, sample

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_text_file_is_not_a_store(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 100)
    for role in ("writer", "reader"):
        with pytest.raises(StoreError, match=r"notes\.db: not a specctl store \(not a SQLite"):
            Store.open(path, role=role)
    assert path.read_text().startswith("these are my notes")  # never overwritten


def test_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    connection.commit()
    connection.close()
    with pytest.raises(StoreError, match=r"other\.db: a SQLite database, but not a specctl store"):
        Store.open(path, role="writer")
    tables = sqlite3.connect(path).execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("customers",)]


def test_store_from_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    Store.open(path, role="writer").close()
    connection = sqlite3.connect(path)
    connection.execute(f"PRAGMA user_version = {CURRENT_VERSION + 5}")
    connection.close()
    for role in ("writer", "reader"):
        with pytest.raises(StoreError, match=r"schema v7 was written by a newer specctl"):
            Store.open(path, role=role)


def test_missing_directory_and_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "specctl.db"
    with pytest.raises(StoreError, match=r"directory .*nowhere does not exist"):
        Store.open(missing, role="writer")
    assert not missing.parent.exists()
    with pytest.raises(StoreError, match=r"no store here yet"):
        Store.open(tmp_path / "absent.db", role="reader")
    empty = tmp_path / "empty.db"
    empty.touch()
    with pytest.raises(StoreError, match=r"empty file, not a specctl store yet"):
        Store.open(empty, role="reader")
    Store.open(empty, role="writer").close()  # an empty file becomes a store
    Store.open(empty, role="reader").close()


def _read_only_command(directory: Path, command: list[str]) -> tuple[list[str], bool]:
    """Run `command` where `directory` is read-only: as root (who writes anywhere) inside a
    private mount namespace with a read-only bind mount; otherwise by file mode."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return command, False
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("root without unshare/mount: cannot make a read-only location")
    script = (
        f'mount --bind "{directory}" "{directory}" && '
        f'mount -o remount,ro,bind "{directory}" && exec "$@"'
    )
    return ["unshare", "-m", "sh", "-c", script, "sh", *command], True


def test_read_only_location_is_named() -> None:
    directory = Path(tempfile.mkdtemp(prefix="specctl-ro-", dir="/tmp"))
    code = (
        "import sys\nfrom db import Store, StoreError\n"
        "try:\n    Store.open(sys.argv[1], role='writer')\n"
        "except StoreError as error:\n    print(error)\n"
    )
    try:
        command, _ = _read_only_command(
            directory, [sys.executable, "-c", code, str(directory / "specctl.db")]
        )
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
    finally:
        directory.chmod(0o755)
        shutil.rmtree(directory)
    assert result.returncode == 0, result.stderr
    assert f"directory {directory} is read-only for this user" in result.stdout, result


def test_reader_cannot_write(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    Store.open(path, role="writer").close()
    with Store.open(path, role="reader") as reader, pytest.raises(StoreError, match="reader"):
        reader.write(WriteBatch(metric_samples=[sample(1, 1.0)]))


def test_locked_store_gives_busy_quickly_never_a_hang(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    writer = Store.open(path, role="writer", busy_timeout_ms=100)
    deployment_id = writer.add_deployment(deployment_row())
    writer.write(WriteBatch(metric_samples=[sample(deployment_id, 1.0)]))
    reader = Store.open(path, role="reader")
    # fault injection: another process holds the write lock (a stuck writer, a backup)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO gpu_sample (node_name, gpu_index, time_unix_s) VALUES ('x', 0, 1)")
    try:
        started = time.monotonic()
        with pytest.raises(StoreBusyError, match=r"store busy \(still locked after 100 ms\)"):
            writer.write(WriteBatch(metric_samples=[sample(deployment_id, 2.0)]))
        assert time.monotonic() - started < 5.0  # a bound on hanging, not a speed claim
        latest = reader.latest_sample(deployment_id)  # WAL: readers read through a write lock
        assert latest is not None and latest.time_unix_s == 1.0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    writer.write(WriteBatch(metric_samples=[sample(deployment_id, 3.0)]))  # lock gone: works
    latest = reader.latest_sample(deployment_id)
    assert latest is not None and latest.time_unix_s == 3.0
    writer.close()
    reader.close()


def test_exclusively_locked_file_makes_a_reader_busy_not_frozen(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    Store.open(path, role="writer").close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        with pytest.raises(StoreBusyError, match=r"store busy \(locked by another process"):
            Store.open(path, role="reader")  # the default reader wait: 250 ms
        assert time.monotonic() - started < 5.0
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_damaged_row_is_a_store_error_naming_the_file(tmp_path: Path) -> None:
    """A JSON column holding what is not JSON (another writer, a bad disk): a StoreError,
    not the JSONDecodeError that gave `specctl status` a traceback."""
    path = tmp_path / "specctl.db"
    with Store.open(path, role="writer") as store:
        deployment = store.add_deployment(deployment_row())
        store.write(WriteBatch(metric_samples=[sample(deployment, time.time())]))
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE metric_sample SET per_position_acceptance = 'not json'")
    with (
        Store.open(path, role="reader") as store,
        pytest.raises(StoreError, match=rf"^{path}: a damaged row \("),
    ):
        store.samples_since(deployment, 0.0)
