"""The head's port of a home's local Ray nodes stays on record while any of them may still
run: retiring some nodes (apply of a file that lists fewer) keeps it, retiring the last of
them (the file now lists specd nodes alone) or `down` forgets it."""

import shutil
from pathlib import Path

from specctl.apply.cluster_up import retire_nodes
from specctl.apply.state import NodeState
from specctl.cluster.local_cluster import HEAD_PORT_FILE, LocalCluster
from specctl.cluster.local_nodes import LocalNodeSpec
from specctl.home import SpecctlHome


def _local(name: str, token: Path) -> NodeState:
    return NodeState(name, "local", "local", str(token))


def test_retiring_some_nodes_keeps_the_heads_port_and_down_forgets_it(tmp_path: Path) -> None:
    root, token = SpecctlHome(tmp_path).ray_root, tmp_path / "cluster.token"  # short, in /tmp
    try:
        cluster = LocalCluster([LocalNodeSpec("head"), LocalNodeSpec("spare")], root, token)
        port = (root / HEAD_PORT_FILE).read_text()
        # the nodes never started: stopping them finds nothing to stop
        head, spare = _local("head", token), _local("spare", token)
        assert retire_nodes([head, spare], [head], root, token) == ["spare"]
        assert (root / HEAD_PORT_FILE).read_text() == port, "a retired node took the head's port"
        again = LocalCluster([LocalNodeSpec("head")], root, token)
        assert again.nodes[0].config.ray.port == cluster.nodes[0].config.ray.port == int(port)
        assert again.stop() == []
        assert not (root / HEAD_PORT_FILE).exists()
        # some nodes alone never start a head: they make no record either
        LocalCluster([LocalNodeSpec("spare")], root, token, whole=False)
        assert not (root / HEAD_PORT_FILE).exists()
        # every local node retired (specd nodes alone from now on): nothing left to need it
        LocalCluster([LocalNodeSpec("head")], root, token)
        remote = NodeState("gpu-box", "specd", "10.0.0.2:7601", str(token))
        assert retire_nodes([head, remote], [remote], root, token) == ["head"]
        assert not (root / HEAD_PORT_FILE).exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)
