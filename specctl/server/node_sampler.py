"""GPU and memory use per node, read every few seconds by the serving process for the history:
each specd node's `/v1/inventory` (with the cluster token), and this machine's own inventory
(NVML, or memory alone on a CPU-only machine) for the nodes that run locally.

Rows go through the history's `BatchWriter` like every other sample: a node as last seen
(`NodeRow`, `GpuRow`) and one `GpuSample` per GPU per reading (gpu_index -1: the memory of a
node without GPUs). A node that cannot be read is recorded as unreachable with the reason.
"""

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemon.specd.collect import collect_inventory
from db import BatchWriter, GpuRow, GpuSample, NodeRow
from specctl.apply.state import NodeState
from specctl.planner.gather import InventoryError, fetch_inventory_at

logger = logging.getLogger(__name__)

SAMPLE_INTERVAL_S = 5.0
SPECD_TIMEOUT_S = 2.0
STOP_TIMEOUT_S = 5.0

InventoryReader = Callable[[NodeState], dict[str, Any]]


def read_inventory(node: NodeState) -> dict[str, Any]:
    if node.kind == "local":
        return collect_inventory(node.name).to_json()
    return fetch_inventory_at(node.address, Path(node.token_file), SPECD_TIMEOUT_S)


def rows_from_inventory(
    node: NodeState, inventory: dict[str, Any], now_unix_s: float
) -> tuple[NodeRow, list[GpuRow], list[GpuSample]]:
    host = inventory.get("host", {})
    node_row = NodeRow(
        name=node.name,
        address=node.address,
        num_cpus=host.get("num_cpus"),
        memory_total_bytes=host.get("memory_total_bytes"),
        last_seen_unix_s=now_unix_s,
    )
    gpus = inventory.get("gpus", [])
    gpu_rows = [
        GpuRow(
            node_name=node.name,
            gpu_index=gpu["index"],
            model=gpu.get("name"),
            memory_total_bytes=gpu.get("memory_total_bytes"),
            memory_used_bytes=gpu.get("memory_used_bytes"),
            is_unified_memory=bool(gpu.get("unified_memory")),
            utilization_percent=gpu.get("utilization_gpu_percent"),
            temperature_c=gpu.get("temperature_c"),
            last_seen_unix_s=now_unix_s,
        )
        for gpu in gpus
    ]
    samples = [
        GpuSample(
            node_name=node.name,
            gpu_index=gpu["index"],
            time_unix_s=now_unix_s,
            utilization_percent=gpu.get("utilization_gpu_percent"),
            memory_used_bytes=gpu.get("memory_used_bytes"),
            temperature_c=gpu.get("temperature_c"),
            power_draw_w=gpu.get("power_draw_w"),
        )
        for gpu in gpus
    ]
    if not gpus and host.get("memory_total_bytes") is not None:  # a CPU node: its memory
        used = host["memory_total_bytes"] - host.get("memory_available_bytes", 0)
        samples.append(
            GpuSample(node_name=node.name, gpu_index=-1, time_unix_s=now_unix_s,
                      memory_used_bytes=used)
        )  # fmt: skip
    return node_row, gpu_rows, samples


class NodeSampler:
    """Reads every node of the deployment every `interval_s` on a thread of its own."""

    def __init__(
        self,
        nodes: list[NodeState],
        writer: BatchWriter,
        interval_s: float = SAMPLE_INTERVAL_S,
        reader: InventoryReader = read_inventory,
    ) -> None:
        self._nodes = nodes
        self._writer = writer
        self._interval_s = interval_s
        self._reader = reader
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(STOP_TIMEOUT_S)

    def sample_once(self) -> None:
        now = time.time()
        local: dict[str, Any] | None = None  # one reading of this machine for its local nodes
        for node in self._nodes:
            try:
                if node.kind == "local":
                    local = local if local is not None else self._reader(node)
                    inventory = local
                else:
                    inventory = self._reader(node)
            except (InventoryError, OSError) as exc:
                self._writer.see_node(
                    NodeRow(name=node.name, address=node.address, is_reachable=False,
                            error=str(exc), last_seen_unix_s=now),
                    [],
                )  # fmt: skip
                continue
            node_row, gpu_rows, samples = rows_from_inventory(node, inventory, now)
            self._writer.see_node(node_row, gpu_rows)
            for sample in samples:
                self._writer.add_gpu_sample(sample)

    def _run(self) -> None:
        while True:
            try:
                self.sample_once()
            except Exception:  # a reading must never stop the serving process
                logger.exception("reading the nodes failed")
            if self._stop.wait(self._interval_s):
                return
