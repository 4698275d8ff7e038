"""One two-node Ray cluster for the tests of this package (a cluster takes seconds to start):
`verifier-node` and `drafter-node`, token auth on."""

from collections.abc import Iterator

import pytest

from specctl.cluster.local_nodes import LocalNodeSpec
from tests.distributed.ray_cluster import TestCluster, ray_processes_under

VERIFIER_NODE = "verifier-node"
DRAFTER_NODE = "drafter-node"


@pytest.fixture(scope="package")
def cluster() -> Iterator[TestCluster]:
    test_cluster = TestCluster([LocalNodeSpec(VERIFIER_NODE), LocalNodeSpec(DRAFTER_NODE)])
    yield test_cluster
    leftover = test_cluster.close()
    assert leftover == [], f"Ray processes survived the cluster's stop: {leftover}"
    assert ray_processes_under(test_cluster.root) == []
