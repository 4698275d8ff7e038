"""BatchWriter: rows from several threads land in one transaction; a busy store keeps them for
the next flush, up to a bound."""

import sqlite3
import threading
from pathlib import Path

import pytest

from db import BatchWriter, GpuRow, NodeRow, Store, StoreError, WriteBatch
from db.errors import RowsRefusedError

from .helpers import deployment_row, request, sample


def test_rows_from_threads_are_flushed_together(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Store.open(path, role="writer") as store:
        deployment_id = store.add_deployment(deployment_row())
        writer = BatchWriter(store)

        def produce(offset: int) -> None:
            for i in range(100):
                writer.add_request(request(deployment_id, 1000.0 + i, f"t{offset}-{i}"))

        threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        writer.add_sample(sample(deployment_id, 1000.0))
        writer.see_node(
            NodeRow(name="spark", address="spark:7601", last_seen_unix_s=1000.0),
            [GpuRow(node_name="spark", gpu_index=0, model="NVIDIA GB10", last_seen_unix_s=1.0)],
        )
        assert writer.flush() == 403
        assert writer.flush() == 0
        assert len(store.recent_requests(limit=1000)) == 400
        assert [g.model for g in store.gpus()] == ["NVIDIA GB10"]


def test_busy_store_keeps_rows_for_the_next_flush_within_a_bound(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Store.open(path, role="writer", busy_timeout_ms=50) as store:
        deployment_id = store.add_deployment(deployment_row())
        writer = BatchWriter(store, max_pending_rows=5)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # fault injection: someone holds the write lock
        try:
            for i in range(3):
                writer.add_sample(sample(deployment_id, float(i)))
            assert writer.flush() == 0
            for i in range(3, 7):
                writer.add_sample(sample(deployment_id, float(i)))
            assert writer.flush() == 0
            assert writer.num_pending_rows == 5 and writer.num_dropped_rows == 2
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert writer.flush() == 5
        kept = store.samples_since(deployment_id, 0.0)
        assert [s.time_unix_s for s in kept] == [2.0, 3.0, 4.0, 5.0, 6.0]  # the newest survive


def test_one_reader_store_serves_several_threads_while_a_writer_writes(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    writer_store = Store.open(path, role="writer")
    deployment_id = writer_store.add_deployment(deployment_row())
    reader = Store.open(path, role="reader")  # shared by the TUI's workers
    errors: list[BaseException] = []
    now = 1_000_000.0

    def read() -> None:
        try:
            for _ in range(50):
                reader.recent_samples(deployment_id, minutes=1.0, now_unix_s=now + 60)
                reader.nodes()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=read) for _ in range(3)]
    for thread in threads:
        thread.start()
    for i in range(50):
        writer_store.write(WriteBatch(metric_samples=[sample(deployment_id, now + i)]))
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(reader.recent_samples(deployment_id, minutes=1.0, now_unix_s=now + 60)) == 50
    last_15_s = reader.recent_samples(deployment_id, minutes=0.25, now_unix_s=now + 60)
    assert [s.time_unix_s - now for s in last_15_s] == [45.0, 46.0, 47.0, 48.0, 49.0]
    writer_store.close()
    reader.close()


def test_a_refused_row_does_not_take_the_others_with_it(tmp_path: Path) -> None:
    """A sample whose tokens/s is NaN (NULL in a NOT NULL column): the transaction fails;
    the other rows are written one by one and it alone is dropped and counted."""
    path = tmp_path / "s.db"
    with Store.open(path, role="writer") as store:
        deployment_id = store.add_deployment(deployment_row())
        writer = BatchWriter(store)
        for i in range(5):
            writer.add_sample(sample(deployment_id, 1000.0 + i))
        writer.add_sample(sample(deployment_id, 1010.0, tokens_per_s=float("nan")))
        writer.add_request(request(deployment_id, 1000.0, "kept"))
        with pytest.raises(RowsRefusedError, match=r"1 row\(s\) refused and dropped .*; 6 written"):
            writer.flush()
        assert writer.num_dropped_rows == 1 and writer.num_pending_rows == 0
        assert len(store.samples_since(deployment_id, 0.0)) == 5
        assert [r.request_id for r in store.recent_requests()] == ["kept"]


def test_a_store_that_refuses_every_row_keeps_them_for_the_next_flush(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Store.open(path, role="writer") as store:
        deployment_id = store.add_deployment(deployment_row())
        writer = BatchWriter(store)
        writer.add_sample(sample(deployment_id, 1000.0))
        with sqlite3.connect(path) as raw:  # the table gone: every write fails
            raw.execute("ALTER TABLE metric_sample RENAME TO gone")
        with pytest.raises(StoreError):
            writer.flush()
        assert writer.num_pending_rows == 1 and writer.num_dropped_rows == 0
