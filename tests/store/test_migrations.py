"""Schema versions: a fresh file, a real v1 file migrated to the current schema, and the
tables the migrations build match the SQLModel classes."""

import sqlite3
from pathlib import Path

import pytest

from db import CURRENT_VERSION, Store, StoreError, WriteBatch
from db.migrations import APPLICATION_ID, MIGRATIONS, apply_migrations
from db.tables import ALL_TABLES

from .helpers import deployment_row, sample


def _make_v1_file(path: Path) -> None:
    """A store exactly as specctl with schema v1 left it, holding a few rows."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA auto_vacuum = INCREMENTAL")
    connection.execute("PRAGMA journal_mode = WAL")
    apply_migrations(connection, target_version=1)
    connection.execute(
        "INSERT INTO deployment (name, config_path, config_text, plan_json, applied_unix_s,"
        " status) VALUES ('old', 'c.toml', 'x = 1', '{}', 1000.0, 'stopped')"
    )
    connection.execute(
        "INSERT INTO gpu_sample (node_name, gpu_index, time_unix_s, utilization_percent,"
        " memory_used_bytes) VALUES ('spark', 0, 1000.0, 87, 123)"
    )
    connection.close()


def _columns(connection: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in connection.execute(f"PRAGMA table_info({table})")}


def _indexes(connection: sqlite3.Connection) -> set[str]:
    rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
    return {row[0] for row in rows if not row[0].startswith("sqlite_autoindex")}


def test_fresh_store_has_the_current_schema_and_matches_the_models(tmp_path: Path) -> None:
    path = tmp_path / "specctl.db"
    with Store.open(path, role="writer") as store:
        assert store.found_schema_version == 0
    connection = sqlite3.connect(path)
    assert connection.execute("PRAGMA user_version").fetchone()[0] == CURRENT_VERSION
    assert connection.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert connection.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    for model in ALL_TABLES:
        table = model.__table__  # type: ignore[attr-defined]
        assert _columns(connection, table.name) == {c.name for c in table.columns}, table.name
    model_indexes = {ix.name for model in ALL_TABLES for ix in model.__table__.indexes}  # type: ignore[attr-defined]
    assert _indexes(connection) == model_indexes


def test_v1_file_migrates_to_current_keeping_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    _make_v1_file(path)
    before = sqlite3.connect(path)
    assert before.execute("PRAGMA user_version").fetchone()[0] == 1
    assert "temperature_c" not in _columns(before, "gpu_sample")
    before.close()

    with pytest.raises(StoreError, match=r"schema v1 is older than v2.*upgrades it"):
        Store.open(path, role="reader")

    with Store.open(path, role="writer") as store:
        assert store.found_schema_version == 1
        old = store.latest_deployment()
        assert old is not None and old.name == "old" and old.status == "stopped"
        history = store.gpu_samples_since(0.0)
        assert [(g.node_name, g.utilization_percent, g.temperature_c) for g in history] == [
            ("spark", 87, None)
        ]
        new_id = store.add_deployment(deployment_row("new"))
    after = sqlite3.connect(path)
    assert after.execute("PRAGMA user_version").fetchone()[0] == CURRENT_VERSION
    assert {"temperature_c", "power_draw_w"} <= _columns(after, "gpu_sample")
    assert "ix_metric_sample_deployment_time" in _indexes(after)
    after.close()
    with Store.open(path, role="reader") as reader:
        assert [d.name for d in reader.deployments()] == ["new", "old"]
        assert reader.deployment(new_id) is not None


def test_migrations_are_ordered_and_each_bumps_the_version() -> None:
    versions = [step.version for step in MIGRATIONS]
    assert versions == list(range(1, CURRENT_VERSION + 1))
    assert all(step.statements and step.description for step in MIGRATIONS)


def test_second_writer_finds_the_migration_done(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Store.open(path, role="writer") as first:
        deployment_id = first.add_deployment(deployment_row())
        with Store.open(path, role="writer") as second:
            assert second.found_schema_version == CURRENT_VERSION
            second.write(WriteBatch(metric_samples=[sample(deployment_id, 5.0)]))
    with Store.open(path, role="reader") as reader:
        latest = reader.latest_sample(deployment_id)
        assert latest is not None and latest.per_position_acceptance == [0.9, 0.7, 0.5, 0.3]


def test_deployment_status_round_trip_and_bad_status(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.db", role="writer") as store:
        deployment_id = store.add_deployment(deployment_row())
        store.set_deployment_status(
            deployment_id, "failed", "shard r0/drafter: out of memory", "http://127.0.0.1:8000/v1"
        )
        row = store.deployment(deployment_id)
        assert row is not None
        assert (row.status, row.status_message, row.endpoint) == (
            "failed",
            "shard r0/drafter: out of memory",
            "http://127.0.0.1:8000/v1",
        )
        with pytest.raises(ValueError, match="deployment status must be one of"):
            store.set_deployment_status(deployment_id, "exploded")
        with pytest.raises(StoreError, match="no deployment with id 99"):
            store.set_deployment_status(99, "stopped")


def test_default_store_path_follows_specctl_home(tmp_path: Path) -> None:
    from db import default_store_path

    assert default_store_path({"SPECCTL_HOME": str(tmp_path)}) == tmp_path / "specctl.db"
    assert default_store_path({}) == Path("~/.specctl/specctl.db").expanduser()
