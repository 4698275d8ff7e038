"""A head's specd gives its GCS address as Ray advertises it, and a worker on another address
joins with it: the worker's specd runs in a network namespace of its own (another machine, as
far as addresses go), joined to this one by a veth pair. specd gave a head without
`ray.node_ip_address` as 127.0.0.1:port, and a worker elsewhere, told to join that, dialled its
own loopback and failed ("Ray head 127.0.0.1:port is unreachable").

Needs root and `ip netns` (the test machine has both); skipped where either is missing."""

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.specd.address import is_loopback, parse_address

from .specd_process import SpecdProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

IP_TIMEOUT_S = 20
SUBNET = f"10.213.{os.getpid() % 250}"  # a /24 per test process: two runs do not collide
HOST_ADDRESS, NS_ADDRESS = f"{SUBNET}.1", f"{SUBNET}.2"


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )


def _must(*args: str) -> None:
    result = _ip(*args)
    assert result.returncode == 0, f"ip {' '.join(args)}: {result.stderr}"


@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    """A network namespace with NS_ADDRESS, routed to this one (HOST_ADDRESS) by a veth pair,
    its default route through it: Ray there finds NS_ADDRESS as its node IP, and reaches this
    machine's addresses through the pair."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2's `ip` for a network namespace")
    if not _ip("route", "show", "default").stdout.strip():
        pytest.skip("no default route here: Ray would advertise loopback on either side")
    name = f"specctl-t{os.getpid()}"
    outer, inner = f"sct{os.getpid() % 100000}a", f"sct{os.getpid() % 100000}b"
    added = _ip("netns", "add", name)
    if added.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {added.stderr.strip()}")
    try:
        _must("link", "add", outer, "type", "veth", "peer", "name", inner)
        _must("link", "set", inner, "netns", name)
        _must("addr", "add", f"{HOST_ADDRESS}/24", "dev", outer)
        _must("link", "set", outer, "up")
        for args in (
            ("addr", "add", f"{NS_ADDRESS}/24", "dev", inner),
            ("link", "set", inner, "up"),
            ("link", "set", "lo", "up"),
            ("route", "add", "default", "via", HOST_ADDRESS),
        ):
            _must("netns", "exec", name, "ip", *args)
        yield name
    finally:
        _ip("link", "del", outer)  # takes its peer with it
        _ip("netns", "del", name)


def test_a_worker_on_another_address_joins_the_address_the_head_gives(
    netns: str, cluster_token: tuple[Path, str]
) -> None:
    token_file, token = cluster_token
    head = SpecdProcess(token_file, token, "here")
    try:
        worker = SpecdProcess(
            token_file, token, "there", host=NS_ADDRESS, prefix=("ip", "netns", "exec", netns)
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
        assert alive["there"]["address"] == NS_ADDRESS  # the worker's node is the other side

        for daemon in (worker, head):
            stopped = daemon.call("POST", "/v1/ray/stop")
            assert stopped.json() == {"stopped": True, "leftover_pids": []}, stopped.text
    finally:
        worker.close()
        head.close()
    assert worker.ray_pids() == [] and head.ray_pids() == []
