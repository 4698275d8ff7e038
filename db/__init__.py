"""The specctl store: nodes, deployments, metric history and request records in one SQLite file.

One writer (the serving process), many readers (the TUI, `specctl status`); WAL mode, explicit
`BEGIN IMMEDIATE` writes, short reader timeouts, `user_version` migrations, retention.
Importing this package never imports torch or textual.
"""

from db.batch_writer import BatchWriter
from db.errors import StoreBusyError, StoreError
from db.migrations import CURRENT_VERSION
from db.paths import default_store_path, specctl_home
from db.retention import RetentionPolicy, TrimReport
from db.store import Store
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

__all__ = [
    "CURRENT_VERSION",
    "DEPLOYMENT_STATUSES",
    "BatchWriter",
    "DeploymentRow",
    "GpuRow",
    "GpuSample",
    "MetricSample",
    "NodeRow",
    "RequestRecord",
    "RetentionPolicy",
    "Store",
    "StoreBusyError",
    "StoreError",
    "TrimReport",
    "WriteBatch",
    "default_store_path",
    "specctl_home",
]
