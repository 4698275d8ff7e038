"""Several Ray nodes on this machine forming one cluster: the first is the head.

Re-creating a `LocalCluster` over the same root directory finds the nodes a previous process
started (their state files), so `apply` can start nodes and a later `down` stop them.
"""

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from specctl.cluster.local_nodes import LocalClusterError, LocalNode, LocalNodeSpec
from specctl.cluster.ports import free_port, reserve

HEAD_PORT_FILE = "head-port"
MAX_NODE_DIR_CHARS = 16


def node_dir_name(name: str) -> str:
    """A short, stable directory name for a node (Ray's socket paths must stay short)."""
    if len(name) <= MAX_NODE_DIR_CHARS and name.replace("-", "").replace("_", "").isalnum():
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    short = "".join(c for c in name if c.isalnum())[: MAX_NODE_DIR_CHARS - 7]
    return f"{short}-{digest}"


class LocalCluster:
    def __init__(
        self, specs: list[LocalNodeSpec], root: Path, token_file: Path, whole: bool = True
    ) -> None:
        """`whole` False: some of the cluster's nodes, the head perhaps not among them (nodes
        retired from a running cluster): stopping them keeps the head's port on record."""
        if not specs:
            raise LocalClusterError("a local cluster needs at least one node")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise LocalClusterError(f"local node names must be distinct, got {names}")
        self.root = root
        self.whole = whole
        root.mkdir(parents=True, exist_ok=True)
        head_port = self._head_port()
        self.nodes = [
            LocalNode(s, root / node_dir_name(s.name), token_file, head_port) for s in specs
        ]

    def _head_port(self) -> int:
        path = self.root / HEAD_PORT_FILE
        if path.is_file():
            port = int(json.loads(path.read_text()))
            reserve(port)  # a node's other ports must not take it
            return port
        port = free_port()
        if self.whole:  # some nodes alone (being retired) never start a head: no record
            path.write_text(json.dumps(port))
        return port

    @property
    def head(self) -> LocalNode:
        return self.nodes[0]

    @property
    def address(self) -> str:
        """host:port of the head's GCS (the head must be running)."""
        running = self.head.running
        if running is None:
            raise LocalClusterError(f"the head node {self.head.spec.name} is not running")
        return running.gcs_address

    def start(self, head_address: str | None = None, fresh_head: bool = False) -> str:
        """Start every node not already running (idempotent); returns the GCS address.
        Without `head_address` the first node is the head; with one, all join it
        (`fresh_head`: that head was just started). Where the head was started anew, a
        worker found running is restarted: it had joined the GCS that died with the old head
        (at the same address), and the new one does not know it."""
        workers = self.nodes
        if head_address is None:
            fresh_head = self.head.running is None
            head_address = self.head.start(None).gcs_address
            workers = self.nodes[1:]
        for node in workers:
            if fresh_head and node.running is not None:
                leftover = node.stop()
                if leftover:  # still joined to the dead GCS: a start would find it running
                    raise LocalClusterError(
                        f"local node {node.spec.name}: joined to the old head's GCS, and pids "
                        f"{', '.join(map(str, leftover))} of it would not stop"
                    )
            node.start(head_address)
        return head_address

    def stop(self) -> list[int]:
        """Stop every node at once (each waits out its processes' grace period, so in turn
        they would add up); returns pids that would not die (empty: clean). The head's port
        is forgotten with the whole cluster only."""
        leftover: list[int] = []
        if self.nodes:
            with ThreadPoolExecutor(max_workers=len(self.nodes)) as pool:
                for pids in pool.map(lambda node: node.stop(), self.nodes):
                    leftover += pids
        if self.whole:
            (self.root / HEAD_PORT_FILE).unlink(missing_ok=True)
        return leftover
