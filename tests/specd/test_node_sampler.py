"""The serving process's node readings: a real specd's inventory (with the cluster token), this
machine for local nodes, and a node that does not answer, written to a real SQLite store."""

import socket
import time
from pathlib import Path

from db import BatchWriter, Store
from specctl.apply.state import NodeState
from specctl.server.node_sampler import NodeSampler

from .specd_process import SpecdProcess


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_nodes_and_memory_are_recorded(
    tmp_path: Path, specd_single: SpecdProcess, cluster_token: tuple[Path, str]
) -> None:
    token_file, _ = cluster_token
    nodes = [
        NodeState("here", "local", "local", str(token_file)),
        NodeState("also-here", "local", "local", str(token_file)),
        NodeState("solo", "specd", f"127.0.0.1:{specd_single.port}", str(token_file)),
        NodeState("gone", "specd", f"127.0.0.1:{_closed_port()}", str(token_file)),
    ]
    started = time.time()
    with Store.open(tmp_path / "specctl.db", role="writer") as store:
        writer = BatchWriter(store)
        NodeSampler(nodes, writer).sample_once()
        assert writer.flush() > 0
    with Store.open(tmp_path / "specctl.db", role="reader") as reader:
        rows = {row.name: row for row in reader.nodes()}
        samples = reader.gpu_samples_since(started)
    assert set(rows) == {"here", "also-here", "solo", "gone"}
    assert rows["solo"].is_reachable and rows["solo"].num_cpus and rows["solo"].memory_total_bytes
    assert not rows["gone"].is_reachable and "unreachable" in (rows["gone"].error or "")
    # no GPU here (NVML absent): each reachable node's memory in use, as gpu_index -1
    by_node = {s.node_name: s for s in samples}
    assert set(by_node) == {"here", "also-here", "solo"}
    for sample in by_node.values():
        assert sample.gpu_index == -1 and (sample.memory_used_bytes or 0) > 0


def test_a_wrong_token_is_said(tmp_path: Path, specd_single: SpecdProcess) -> None:
    wrong = tmp_path / "wrong.token"
    wrong.write_text("ab" * 32)
    wrong.chmod(0o600)
    node = NodeState("solo", "specd", f"127.0.0.1:{specd_single.port}", str(wrong))
    with Store.open(tmp_path / "specctl.db", role="writer") as store:
        writer = BatchWriter(store)
        NodeSampler([node], writer).sample_once()
        writer.flush()
        (row,) = store.nodes()
    assert not row.is_reachable and "refused the cluster token" in (row.error or "")
