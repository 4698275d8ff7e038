"""BatchWriter: rows gathered from any thread, written once a second in one transaction.

The serving process adds a request record as each request finishes and a metric sample every
second; a thread of its own calls flush() once a second. A flush that meets a locked store keeps
its rows for the next one (up to `max_pending_rows`; past that the oldest are dropped and
counted), so a slow reader or a backup never loses the last seconds and never grows memory
without bound.
"""

import threading

from db.errors import RowsRefusedError, StoreBusyError, StoreError
from db.store import Store
from db.tables import GpuRow, GpuSample, MetricSample, NodeRow, RequestRecord
from db.writes import WriteBatch

DEFAULT_MAX_PENDING_ROWS = 50_000
CONSTRAINT_FAILED = "constraint failed"  # SQLite's words for a row a table refuses


class BatchWriter:
    def __init__(self, store: Store, max_pending_rows: int = DEFAULT_MAX_PENDING_ROWS) -> None:
        if store.role != "writer":
            raise ValueError("BatchWriter needs a store opened with role='writer'")
        self.store = store
        self.max_pending_rows = max_pending_rows
        self.num_dropped_rows = 0  # rows given up: the store stayed busy too long, or refused them
        self._lock = threading.Lock()
        self._pending = WriteBatch()

    def add_sample(self, sample: MetricSample) -> None:
        with self._lock:
            self._pending.metric_samples.append(sample)

    def add_gpu_sample(self, sample: GpuSample) -> None:
        with self._lock:
            self._pending.gpu_samples.append(sample)

    def add_request(self, record: RequestRecord) -> None:
        with self._lock:
            self._pending.request_records.append(record)

    def see_node(self, node: NodeRow, gpus: list[GpuRow]) -> None:
        """Record a node's latest state (replaces what was last recorded for it)."""
        with self._lock:
            self._pending.nodes.append(node)
            self._pending.gpus.extend(gpus)

    @property
    def num_pending_rows(self) -> int:
        with self._lock:
            return self._pending.num_rows

    def flush(self) -> int:
        """Write everything pending in one transaction; returns the rows written (0 when the
        store was busy: the rows wait for the next flush). Where a constraint refuses the
        transaction (a NaN in a NOT NULL column), each row is written alone: the refused ones
        are dropped and counted (RowsRefusedError, after the others are in); one such sample
        took the whole second's rows with it. Any other StoreError (the file went away, a full
        disk) keeps the rows for the next flush, within `max_pending_rows`, and propagates."""
        with self._lock:
            batch, self._pending = self._pending, WriteBatch()
        try:
            self.store.write(batch)
        except StoreBusyError:
            self._put_back(batch)
            return 0
        except StoreError as error:
            if CONSTRAINT_FAILED not in str(error):
                self._put_back(batch)
                raise
            return self._write_alone(batch, error)
        return batch.num_rows

    def _write_alone(self, batch: WriteBatch, error: StoreError) -> int:
        written, refused, busy = 0, 0, WriteBatch()
        for unit in _units(batch):
            try:
                self.store.write(unit)
            except StoreBusyError:
                busy.extend(unit)  # in order, put back at once below
            except StoreError as exc:
                refused += unit.num_rows
                error = exc
            else:
                written += unit.num_rows
        if busy.num_rows:
            self._put_back(busy)
        if refused:
            self.num_dropped_rows += refused
            raise RowsRefusedError(
                f"{refused} row(s) refused and dropped ({error}); {written} written", written
            )
        return written

    def _put_back(self, batch: WriteBatch) -> None:
        with self._lock:
            batch.extend(self._pending)
            self._pending = batch
            excess = self._pending.num_rows - self.max_pending_rows
            if excess > 0:
                self.num_dropped_rows += _drop_oldest(self._pending, excess)


def _units(batch: WriteBatch) -> list[WriteBatch]:
    """The batch as batches of one row each; a node's state (its row and its GPUs') one."""
    units = [WriteBatch(metric_samples=[row]) for row in batch.metric_samples]
    units += [WriteBatch(gpu_samples=[row]) for row in batch.gpu_samples]
    units += [WriteBatch(request_records=[row]) for row in batch.request_records]
    if batch.nodes or batch.gpus:
        units.append(WriteBatch(nodes=list(batch.nodes), gpus=list(batch.gpus)))
    return units


def _drop_oldest(batch: WriteBatch, num_rows: int) -> int:
    """Drop up to `num_rows` of the oldest samples and records (node state is kept)."""
    dropped = 0
    for rows in (batch.gpu_samples, batch.metric_samples, batch.request_records):
        cut = min(len(rows), num_rows - dropped)
        del rows[:cut]
        dropped += cut
    return dropped
