"""Loopback ports for a local cluster's servers (specctl/cluster/ports.py): free, below the
kernel's ephemeral range where it has room, and never handed out twice in a process."""

from pathlib import Path

import pytest

from specctl.apply import cluster_up
from specctl.cluster import ports
from specctl.config.loader import load_config
from specctl.home import SpecctlHome

from .deployment_cli import local_cluster_file


def test_no_port_is_handed_out_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """`specctl demo` once gave a node's client server the port just chosen for the head's
    GCS (released, then handed out again) and `ray start` refused it. 300 draws from ~12,000
    ports would repeat one 97% of the time if nothing stopped it."""
    monkeypatch.setattr(ports, "_handed_out", set())
    chosen = [ports.free_port() for _ in range(300)]
    assert len(set(chosen)) == len(chosen)
    low = ports._ephemeral_low()
    if low - ports.LOWEST >= 1000:
        assert all(ports.LOWEST <= port < low for port in chosen)


def test_a_reserved_port_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A head port read back from an earlier process's state is reserved, and no other server
    of the cluster gets it: with all but 50 ports of the range reserved, no draw is one."""
    monkeypatch.setattr(ports, "_handed_out", set())
    low = ports._ephemeral_low()
    reserved = set(range(ports.LOWEST, max(ports.LOWEST, low - 50)))
    for port in reserved:
        ports.reserve(port)
    chosen = [ports.free_port() for _ in range(30)]
    assert not reserved & set(chosen)
    assert len(set(chosen)) == len(chosen)


def test_the_endpoint_port_is_reserved_before_the_nodes_choose_theirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve` binds the cluster file's port only once the nodes are up: a node's client
    server or dashboard agent must not take it first (one test run's `serve` failed with
    "Address already in use"). The nodes' ports are chosen when the local cluster is built."""
    monkeypatch.setattr(ports, "_handed_out", set())
    endpoint = ports.free_port()
    monkeypatch.setattr(ports, "_handed_out", set())
    config = load_config(local_cluster_file(tmp_path / "cluster.toml", endpoint))
    home = SpecctlHome(tmp_path / "home").ensure()
    local = cluster_up.local_cluster(config, home, tmp_path / "token")
    assert local is not None and len(local.nodes) == 2
    chosen = {
        port
        for node in local.nodes
        for port in (
            node.config.ray.client_server_port,
            node.config.ray.dashboard_agent_listen_port,
        )
    }
    assert endpoint in ports._handed_out and endpoint not in chosen


def test_ports_from_the_ephemeral_range_skip_ray_worker_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no room below the kernel's ephemeral range, ports come from it; where that range
    reaches into Ray's worker ports (10000-65535, say) those are skipped, as specd's config
    refuses them. Here the worker range is moved over the lower half of this kernel's
    ephemeral range, so about half of the kernel's picks must be passed over."""
    low = ports._ephemeral_low()
    with open("/proc/sys/net/ipv4/ip_local_port_range") as file:
        high = int(file.read().split()[1])
    workers = range(low, (low + high) // 2)
    monkeypatch.setattr(ports, "_handed_out", set())
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: ports.LOWEST)  # no room below it
    monkeypatch.setattr(ports, "RAY_WORKER_PORTS", workers)
    chosen = [ports.free_port() for _ in range(20)]
    assert not [port for port in chosen if port in workers]
    assert len(set(chosen)) == len(chosen)
