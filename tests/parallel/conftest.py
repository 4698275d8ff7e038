"""One two-node Ray cluster for this package, token auth on: the tensor-parallel ranks of a
shard share a node; the drafter's and the verifier's groups sit on different nodes."""

from collections.abc import Iterator

import pytest

from specctl.cluster.local_nodes import LocalNodeSpec
from tests.distributed.ray_cluster import TestCluster, ray_processes_under

VERIFIER_NODE = "tp-verifier"
DRAFTER_NODE = "tp-drafter"


@pytest.fixture(scope="package")
def cluster() -> Iterator[TestCluster]:
    test_cluster = TestCluster([LocalNodeSpec(VERIFIER_NODE), LocalNodeSpec(DRAFTER_NODE)])
    yield test_cluster
    leftover = test_cluster.close()
    assert leftover == [], f"Ray processes survived the cluster's stop: {leftover}"
    assert ray_processes_under(test_cluster.root) == []
