"""Retention: samples and request records older than a limit, or beyond a row count, go.

Deleted pages go back to the file system (`auto_vacuum = INCREMENTAL` from the first table on),
so the file's size is bounded by the row limits, not by how long the deployment has run.
"""

from dataclasses import dataclass, field

from sqlalchemy import Connection, text

HOUR_S = 3600.0

# (table, time column) of every table that retention trims
_TRIMMED_TABLES = (
    ("metric_sample", "time_unix_s"),
    ("gpu_sample", "time_unix_s"),
    ("request_record", "finished_unix_s"),
)


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How much history the store keeps. The defaults hold a day of one deployment at one
    metric sample per second, in a few tens of MB."""

    max_age_s: float = 24 * HOUR_S
    max_metric_samples: int = 200_000  # one per second per deployment: 2.3 days of one
    max_gpu_samples: int = 400_000  # one per second per GPU
    max_request_records: int = 200_000
    trim_interval_s: float = 60.0  # how often the writer trims, at most

    def __post_init__(self) -> None:
        if self.max_age_s <= 0:
            raise ValueError(f"retention max_age_s must be > 0, got {self.max_age_s}")
        for name in ("max_metric_samples", "max_gpu_samples", "max_request_records"):
            if getattr(self, name) < 1:
                raise ValueError(f"retention {name} must be >= 1, got {getattr(self, name)}")
        if self.trim_interval_s < 0:
            raise ValueError(f"retention trim_interval_s must be >= 0, got {self.trim_interval_s}")

    def max_rows(self, table: str) -> int:
        return {
            "metric_sample": self.max_metric_samples,
            "gpu_sample": self.max_gpu_samples,
            "request_record": self.max_request_records,
        }[table]


@dataclass(slots=True)
class TrimReport:
    num_deleted: dict[str, int] = field(default_factory=dict)  # per table

    @property
    def total(self) -> int:
        return sum(self.num_deleted.values())


def trim(connection: Connection, policy: RetentionPolicy, now_unix_s: float) -> TrimReport:
    """Delete what the policy no longer keeps (inside the caller's write transaction)."""
    report = TrimReport()
    cutoff_unix_s = now_unix_s - policy.max_age_s
    for table, time_column in _TRIMMED_TABLES:
        by_age = connection.execute(
            text(f"DELETE FROM {table} WHERE {time_column} < :cutoff"), {"cutoff": cutoff_unix_s}
        )
        # ids grow with insertion order: keep the newest max_rows
        by_count = connection.execute(
            text(
                f"DELETE FROM {table} WHERE id <= "
                f"(SELECT id FROM {table} ORDER BY id DESC LIMIT 1 OFFSET :keep)"
            ),
            {"keep": policy.max_rows(table)},
        )
        report.num_deleted[table] = by_age.rowcount + by_count.rowcount
    return report
