"""A writer and a reader of the store as separate processes, for the concurrency test.

    python tests/store/store_processes.py writer STORE DEPLOYMENT_ID SECONDS
    python tests/store/store_processes.py reader STORE DEPLOYMENT_ID SECONDS

Each prints one JSON line with what it did and every error it met (by message), and exits 0.
"""

import json
import sys
import time
from pathlib import Path

from db import (
    GpuSample,
    MetricSample,
    RequestRecord,
    RetentionPolicy,
    Store,
    StoreBusyError,
    StoreError,
    WriteBatch,
)

# small limits, so that retention deletes and vacuums while the reader reads
RETENTION = RetentionPolicy(
    max_metric_samples=500, max_gpu_samples=1000, max_request_records=2000, trim_interval_s=0.2
)


def _batch(deployment_id: int, step: int, now_unix_s: float) -> WriteBatch:
    sample = MetricSample(
        deployment_id=deployment_id,
        time_unix_s=now_unix_s,
        acceptance_rate=0.5,
        per_position_acceptance=[0.8, 0.6, 0.4, 0.2],
        mean_acceptance_length=2.5,
        tokens_per_s=100.0 + step,
        batch_size=4,
        k_in_use=4.0,
        num_requests_running=4,
    )
    gpus = [
        GpuSample(node_name=name, gpu_index=0, time_unix_s=now_unix_s, utilization_percent=50)
        for name in ("spark", "rtx5090")
    ]
    requests = [
        RequestRecord(
            request_id=f"req-{step}-{i}",
            deployment_id=deployment_id,
            num_prompt_tokens=10,
            num_output_tokens=20,
            e2e_latency_ms=100.0,
            finish_reason="length",
            finished_unix_s=now_unix_s,
        )
        for i in range(5)
    ]
    return WriteBatch(metric_samples=[sample], gpu_samples=gpus, request_records=requests)


def run_writer(path: Path, deployment_id: int, seconds: float) -> dict[str, object]:
    errors: list[str] = []
    num_batches = 0
    with Store.open(path, role="writer", retention=RETENTION) as store:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                store.write(_batch(deployment_id, num_batches, time.time()))
                num_batches += 1
            except StoreError as error:
                errors.append(str(error))
    return {"num_batches": num_batches, "errors": errors}


def run_reader(path: Path, deployment_id: int, seconds: float) -> dict[str, object]:
    errors: list[str] = []
    num_reads = 0
    seen_ids: set[int] = set()
    with Store.open(path, role="reader") as store:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                latest = store.latest_sample(deployment_id)
                store.samples_since(deployment_id, time.time() - 60)
                store.recent_requests(deployment_id, limit=50)
                store.gpu_samples_since(time.time() - 60)
                store.latest_deployment()
                num_reads += 1
                if latest is not None and latest.id is not None:
                    seen_ids.add(latest.id)
            except (StoreBusyError, StoreError) as error:
                errors.append(f"{type(error).__name__}: {error}")
    return {"num_reads": num_reads, "num_distinct_latest": len(seen_ids), "errors": errors}


def main() -> None:
    role, path, deployment_id, seconds = sys.argv[1:5]
    run = run_writer if role == "writer" else run_reader
    print(json.dumps(run(Path(path), int(deployment_id), float(seconds))), flush=True)


if __name__ == "__main__":
    main()
