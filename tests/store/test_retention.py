"""Retention: old rows and rows past the limits go; the file stops growing."""

import sqlite3
from pathlib import Path

import pytest

from db import GpuSample, RetentionPolicy, Store, WriteBatch

from .helpers import deployment_row, request, sample

NOW_UNIX_S = 2_000_000_000.0


def _counts(path: Path) -> dict[str, int]:
    connection = sqlite3.connect(path)
    tables = ("metric_sample", "gpu_sample", "request_record")
    counts = {t: connection.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}
    connection.close()
    return counts


def test_rows_older_than_max_age_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    policy = RetentionPolicy(max_age_s=3600.0, trim_interval_s=1e9)
    with Store.open(path, role="writer", retention=policy) as store:
        deployment_id = store.add_deployment(deployment_row())
        times = [NOW_UNIX_S - age_s for age_s in (7200.0, 3601.0, 3599.0, 10.0)]
        store.write(
            WriteBatch(
                metric_samples=[sample(deployment_id, t) for t in times],
                gpu_samples=[GpuSample(node_name="n", gpu_index=0, time_unix_s=t) for t in times],
                request_records=[request(deployment_id, t, f"r{i}") for i, t in enumerate(times)],
            )
        )
        report = store.trim(now_unix_s=NOW_UNIX_S)
        assert report.num_deleted == {"metric_sample": 2, "gpu_sample": 2, "request_record": 2}
        kept = store.samples_since(deployment_id, 0.0)
        assert [NOW_UNIX_S - s.time_unix_s for s in kept] == [3599.0, 10.0]
        assert [r.request_id for r in store.recent_requests()] == ["r3", "r2"]
        assert store.latest_deployment() is not None  # deployments are not trimmed


def test_rows_beyond_the_limits_are_dropped_oldest_first(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    policy = RetentionPolicy(
        max_metric_samples=10, max_gpu_samples=5, max_request_records=3, trim_interval_s=1e9
    )
    with Store.open(path, role="writer", retention=policy) as store:
        deployment_id = store.add_deployment(deployment_row())
        for step in range(4):
            times = [NOW_UNIX_S + step * 10 + i for i in range(10)]
            store.write(
                WriteBatch(
                    metric_samples=[sample(deployment_id, t) for t in times],
                    gpu_samples=[
                        GpuSample(node_name="n", gpu_index=0, time_unix_s=t) for t in times
                    ],
                    request_records=[request(deployment_id, t, f"r{t:.0f}") for t in times],
                )
            )
        store.trim(now_unix_s=NOW_UNIX_S + 40)
        assert _counts(path) == {"metric_sample": 10, "gpu_sample": 5, "request_record": 3}
        newest = store.samples_since(deployment_id, 0.0)
        assert [s.time_unix_s - NOW_UNIX_S for s in newest] == [float(t) for t in range(30, 40)]


def test_the_writer_trims_by_itself_and_the_file_size_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    policy = RetentionPolicy(
        max_metric_samples=2000,
        max_gpu_samples=2000,
        max_request_records=2000,
        trim_interval_s=0.0,  # every write
    )
    sizes: list[int] = []
    with Store.open(path, role="writer", retention=policy) as store:
        deployment_id = store.add_deployment(deployment_row())
        for step in range(40):
            base = NOW_UNIX_S + step * 500
            times = [base + i for i in range(500)]
            store.write(
                WriteBatch(
                    metric_samples=[sample(deployment_id, t) for t in times],
                    request_records=[request(deployment_id, t, f"{t}") for t in times],
                ),
                now_unix_s=base,
            )
            if step % 10 == 9:
                connection = sqlite3.connect(path)
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                connection.close()
                sizes.append(path.stat().st_size)
    assert _counts(path)["metric_sample"] == 2000
    assert _counts(path)["request_record"] == 2000
    # 20,000 rows of each were written; the file holds 2,000 and stays the size of 2,000
    assert sizes[-1] <= sizes[0] * 1.2, sizes


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_age_s", 0.0), ("max_metric_samples", 0), ("trim_interval_s", -1.0)],
)
def test_nonsense_policy_is_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        RetentionPolicy(**{field: value})
