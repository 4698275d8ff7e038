"""The head's port of a home's local Ray nodes stays on record while any of them may still
run: retiring some nodes (apply of a file that lists fewer) keeps it, `down` forgets it."""

import shutil
from pathlib import Path

from specctl.cluster.local_cluster import HEAD_PORT_FILE, LocalCluster
from specctl.cluster.local_nodes import LocalNodeSpec
from specctl.home import SpecctlHome


def test_retiring_some_nodes_keeps_the_heads_port_and_down_forgets_it(tmp_path: Path) -> None:
    root, token = SpecctlHome(tmp_path).ray_root, tmp_path / "cluster.token"  # short, in /tmp
    try:
        cluster = LocalCluster([LocalNodeSpec("head"), LocalNodeSpec("spare")], root, token)
        port = (root / HEAD_PORT_FILE).read_text()
        # the nodes never started: stopping them finds nothing to stop, and says so
        assert LocalCluster([LocalNodeSpec("spare")], root, token, whole=False).stop() == []
        assert (root / HEAD_PORT_FILE).read_text() == port, "a retired node took the head's port"
        again = LocalCluster([LocalNodeSpec("head")], root, token)
        assert again.nodes[0].config.ray.port == cluster.nodes[0].config.ray.port == int(port)
        assert again.stop() == []
        assert not (root / HEAD_PORT_FILE).exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)
