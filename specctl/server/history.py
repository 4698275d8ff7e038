"""The serving process's history in SQLite: one metric sample per snapshot interval and one
record per finished request, under the deployment's id.

`HistoryRecorder` is both a snapshot listener and a `ServingObserver`; both are called on the
event loop, so they only append rows to a `BatchWriter` (memory, under a lock). A thread of its
own flushes them once a second in one `BEGIN IMMEDIATE` transaction; a store that stays busy
keeps the rows for the next flush (bounded), so readers never make the server wait or lose
the last seconds.
"""

import logging
import threading
import time
from pathlib import Path

from daemon.runtime.engine.loop import LoopOutput
from daemon.runtime.engine.request import RequestDelta
from db import MetricSample, RequestRecord, Store
from db.batch_writer import BatchWriter
from db.errors import RowsRefusedError, StoreError
from specctl.server.frontend import RequestTiming
from specctl.server.snapshot import MetricsSnapshot

logger = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 1.0
STOP_TIMEOUT_S = 10.0


def sample_row(deployment_id: int, snapshot: MetricsSnapshot) -> MetricSample:
    def ms(value_s: float | None) -> float | None:
        return None if value_s is None else value_s * 1000.0

    return MetricSample(
        deployment_id=deployment_id,
        time_unix_s=snapshot.time_s,
        acceptance_rate=snapshot.acceptance_rate,
        per_position_acceptance=list(snapshot.acceptance_rate_per_pos),
        mean_acceptance_length=snapshot.mean_acceptance_length,
        tokens_per_s=snapshot.tokens_per_s,
        ttft_p50_ms=ms(snapshot.ttft_p50_s),
        ttft_p99_ms=ms(snapshot.ttft_p99_s),
        tpot_p50_ms=ms(snapshot.itl_p50_s),
        tpot_p99_ms=ms(snapshot.itl_p99_s),
        batch_size=snapshot.max_batch_size,
        k_in_use=snapshot.mean_speculation_len,
        num_requests_running=snapshot.num_requests_running,
        num_requests_waiting=snapshot.num_requests_waiting,
    )


def request_row(deployment_id: int, timing: RequestTiming, delta: RequestDelta) -> RequestRecord:
    ttft_s = timing.ttft_s
    return RequestRecord(
        request_id=timing.request_id,
        deployment_id=deployment_id,
        num_prompt_tokens=delta.num_prompt_tokens,
        num_output_tokens=delta.num_output_tokens,
        num_draft_tokens=delta.num_draft_tokens,
        num_accepted_tokens=delta.num_accepted_tokens,
        ttft_ms=None if ttft_s is None else ttft_s * 1000.0,
        e2e_latency_ms=timing.e2e_s * 1000.0,
        finish_reason=delta.finish_reason or "error",
        finished_unix_s=time.time(),
    )


class HistoryRecorder:
    """Writes a deployment's samples and requests to the store at `db_path` (the one writer)."""

    def __init__(
        self, db_path: Path, deployment_id: int, flush_interval_s: float = FLUSH_INTERVAL_S
    ) -> None:
        self.deployment_id = deployment_id
        self._store = Store.open(db_path, role="writer")
        self._writer = BatchWriter(self._store)
        self._interval_s = flush_interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="history-writer", daemon=True)
        self.num_written_rows = 0

    @property
    def writer(self) -> BatchWriter:
        """Where other samplers of the serving process (node readings) add their rows."""
        return self._writer

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Write what is pending, then close the store."""
        self._stop.set()
        self._thread.join(STOP_TIMEOUT_S)
        self._flush()
        self._store.close()

    # -- snapshot listener -------------------------------------------------------------------
    def __call__(self, snapshot: MetricsSnapshot) -> None:
        self._writer.add_sample(sample_row(self.deployment_id, snapshot))

    # -- ServingObserver ---------------------------------------------------------------------
    def on_loop_output(self, output: LoopOutput) -> None:
        pass

    def on_first_token(self, timing: RequestTiming, delta: RequestDelta) -> None:
        pass

    def on_tokens(self, num_tokens: int, gap_s: float) -> None:
        pass

    def on_finished(self, timing: RequestTiming, delta: RequestDelta) -> None:
        self._writer.add_request(request_row(self.deployment_id, timing, delta))

    # -- the writer thread -------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._flush()

    def _flush(self) -> None:
        try:
            self.num_written_rows += self._writer.flush()
        except RowsRefusedError as exc:  # the others are in
            self.num_written_rows += exc.written
            logger.warning("metrics history: %s", exc)
        except StoreError as exc:  # the file went away or is unwritable: say so, keep serving
            logger.warning("metrics history not written: %s", exc)
