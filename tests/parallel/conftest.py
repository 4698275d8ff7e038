"""One three-node Ray cluster for this package, token auth on: the tensor-parallel ranks of a
shard share a node; the drafter's and the verifier's groups sit on different nodes; a
pipeline-parallel verifier's later stage has a node of its own."""

from collections.abc import Iterator

import pytest

from specctl.cluster.local_nodes import LocalNodeSpec
from tests.distributed.ray_cluster import TestCluster, ray_processes_under

VERIFIER_NODE = "tp-verifier"
DRAFTER_NODE = "tp-drafter"
STAGE_NODE = "pp-stage"  # a pipeline's later stage


@pytest.fixture(scope="package")
def cluster() -> Iterator[TestCluster]:
    nodes = [LocalNodeSpec(VERIFIER_NODE), LocalNodeSpec(DRAFTER_NODE), LocalNodeSpec(STAGE_NODE)]
    test_cluster = TestCluster(nodes)
    yield test_cluster
    leftover = test_cluster.close()
    assert leftover == [], f"Ray processes survived the cluster's stop: {leftover}"
    assert ray_processes_under(test_cluster.root) == []
