"""Schema versions, in order. The version lives in `PRAGMA user_version`; the file is marked as
a specctl store by `PRAGMA application_id`.

A step is never edited once released: a change to the schema is a new step appended here, and
the SQLModel classes in tables.py follow the newest step. Each step runs inside the caller's
`BEGIN IMMEDIATE` transaction together with the version bump, so a step either lands whole or
not at all.
"""

import sqlite3
from dataclasses import dataclass

APPLICATION_ID = 0x53504543  # "SPEC": tells a specctl store from any other SQLite file


@dataclass(frozen=True, slots=True)
class Migration:
    version: int  # the schema version after this step
    description: str
    statements: tuple[str, ...]


_V1 = Migration(
    version=1,
    description="nodes, GPUs, deployments, metric samples, GPU samples, request records",
    statements=(
        """CREATE TABLE node (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            address TEXT NOT NULL,
            labels JSON NOT NULL,
            num_cpus INTEGER,
            memory_total_bytes INTEGER,
            is_reachable BOOLEAN NOT NULL,
            error TEXT,
            last_seen_unix_s FLOAT NOT NULL
        )""",
        """CREATE TABLE gpu (
            id INTEGER PRIMARY KEY,
            node_name TEXT NOT NULL,
            gpu_index INTEGER NOT NULL,
            model TEXT,
            memory_total_bytes INTEGER,
            memory_used_bytes INTEGER,
            is_unified_memory BOOLEAN NOT NULL,
            utilization_percent INTEGER,
            temperature_c INTEGER,
            last_seen_unix_s FLOAT NOT NULL,
            UNIQUE (node_name, gpu_index)
        )""",
        """CREATE TABLE deployment (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            config_path TEXT NOT NULL,
            config_text TEXT NOT NULL,
            plan_json TEXT NOT NULL,
            applied_unix_s FLOAT NOT NULL,
            status TEXT NOT NULL,
            status_message TEXT,
            endpoint TEXT
        )""",
        """CREATE TABLE metric_sample (
            id INTEGER PRIMARY KEY,
            deployment_id INTEGER NOT NULL,
            time_unix_s FLOAT NOT NULL,
            acceptance_rate FLOAT,
            per_position_acceptance JSON NOT NULL,
            mean_acceptance_length FLOAT,
            tokens_per_s FLOAT NOT NULL,
            ttft_p50_ms FLOAT,
            ttft_p99_ms FLOAT,
            tpot_p50_ms FLOAT,
            tpot_p99_ms FLOAT,
            batch_size INTEGER NOT NULL,
            k_in_use FLOAT,
            num_requests_running INTEGER NOT NULL,
            num_requests_waiting INTEGER NOT NULL
        )""",
        """CREATE TABLE gpu_sample (
            id INTEGER PRIMARY KEY,
            node_name TEXT NOT NULL,
            gpu_index INTEGER NOT NULL,
            time_unix_s FLOAT NOT NULL,
            utilization_percent INTEGER,
            memory_used_bytes INTEGER
        )""",
        """CREATE TABLE request_record (
            id INTEGER PRIMARY KEY,
            request_id TEXT NOT NULL,
            deployment_id INTEGER NOT NULL,
            num_prompt_tokens INTEGER NOT NULL,
            num_output_tokens INTEGER NOT NULL,
            num_draft_tokens INTEGER NOT NULL,
            num_accepted_tokens INTEGER NOT NULL,
            ttft_ms FLOAT,
            e2e_latency_ms FLOAT NOT NULL,
            finish_reason TEXT NOT NULL,
            finished_unix_s FLOAT NOT NULL
        )""",
    ),
)

_V2 = Migration(
    version=2,
    description="GPU temperature and power in the GPU history; time indexes for the dashboard",
    statements=(
        "ALTER TABLE gpu_sample ADD COLUMN temperature_c INTEGER",
        "ALTER TABLE gpu_sample ADD COLUMN power_draw_w FLOAT",
        # sparklines read one deployment's last minutes; retention deletes by time
        "CREATE INDEX ix_metric_sample_deployment_time"
        " ON metric_sample (deployment_id, time_unix_s)",
        "CREATE INDEX ix_gpu_sample_time ON gpu_sample (time_unix_s)",
        "CREATE INDEX ix_request_record_finished ON request_record (finished_unix_s)",
    ),
)

MIGRATIONS: tuple[Migration, ...] = (_V1, _V2)
CURRENT_VERSION = MIGRATIONS[-1].version


def schema_version(connection: sqlite3.Connection) -> int:
    return int(connection.execute("PRAGMA user_version").fetchone()[0])


def apply_migrations(connection: sqlite3.Connection, target_version: int = CURRENT_VERSION) -> int:
    """Bring the store up to `target_version`, step by step, in one IMMEDIATE transaction.

    Returns the version found before migrating. The connection must be in autocommit mode
    (isolation_level=None); another writer migrating at the same time waits on the lock, then
    finds the work done.
    """
    connection.execute("BEGIN IMMEDIATE")
    try:
        found = schema_version(connection)
        for step in MIGRATIONS:
            if found < step.version <= target_version:
                for statement in step.statements:
                    connection.execute(statement)
        if found < target_version:
            connection.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            connection.execute(f"PRAGMA user_version = {target_version}")
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    return found
