"""A head's specd gives its GCS address as Ray advertises it, and a worker on another address
joins with it: the worker's specd runs in a network namespace of its own (another machine, as
far as addresses go), joined to this one by a veth pair. specd gave a head without
`ray.node_ip_address` as 127.0.0.1:port, and a worker elsewhere, told to join that, dialled its
own loopback and failed ("Ray head 127.0.0.1:port is unreachable").

Needs root and `ip netns` (the test machine has both); skipped where either is missing."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.specd.address import is_loopback, parse_address

from .netns import Namespace, has_default_route, network_namespace
from .specd_process import SpecdProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def netns() -> Iterator[Namespace]:
    if not has_default_route():
        pytest.skip("no default route here: Ray would advertise loopback on either side")
    with network_namespace() as namespace:
        yield namespace


def test_a_worker_on_another_address_joins_the_address_the_head_gives(
    netns: Namespace, cluster_token: tuple[Path, str]
) -> None:
    token_file, token = cluster_token
    head = SpecdProcess(token_file, token, "here")
    try:
        worker = SpecdProcess(
            token_file, token, "there", host=netns.address, prefix=netns.exec_prefix()
        )
    except BaseException:
        head.close()
        raise
    try:
        response = head.call("POST", "/v1/ray/start", json={"role": "head"})
        assert response.status_code == 200, response.text
        gcs_address = response.json()["status"]["gcs_address"]
        host, _ = parse_address(gcs_address)
        assert not is_loopback(host), gcs_address  # as Ray advertises it
        assert head.call("GET", "/v1/ray/status").json()["gcs_address"] == gcs_address

        joined = worker.call(
            "POST", "/v1/ray/start", json={"role": "worker", "address": gcs_address}
        )
        assert joined.status_code == 200, joined.text

        status = head.call("GET", "/v1/ray/status").json()
        assert status["error"] is None, status["error"]
        alive = {n["labels"]["specd.io/node"]: n for n in status["nodes"] if n["alive"]}
        assert sorted(alive) == ["here", "there"]
        assert alive["there"]["address"] == netns.address  # the worker's node is the other side

        for daemon in (worker, head):
            stopped = daemon.call("POST", "/v1/ray/stop")
            assert stopped.json() == {"stopped": True, "leftover_pids": []}, stopped.text
    finally:
        worker.close()
        head.close()
    assert worker.ray_pids() == [] and head.ray_pids() == []
