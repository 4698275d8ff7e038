"""A network namespace joined to this one by a veth pair, for tests that need a second address
(another machine, as far as addresses go) or a resolver of their own. Needs root and
iproute2's `ip`; `network_namespace` skips the test where either is missing."""

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

IP_TIMEOUT_S = 20
SUBNET = f"10.213.{os.getpid() % 250}"  # a /24 per test process: two runs do not collide
HOST_ADDRESS, NS_ADDRESS = f"{SUBNET}.1", f"{SUBNET}.2"
SILENT_ADDRESS = f"{SUBNET}.99"  # on the pair's link, and nothing there answers


@dataclass(frozen=True, slots=True)
class Namespace:
    name: str
    host_address: str  # this side of the pair
    address: str  # the namespace's side

    def exec_prefix(self) -> tuple[str, ...]:
        """What runs a command inside it."""
        return ("ip", "netns", "exec", self.name)


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )


def _must(*args: str) -> None:
    result = _ip(*args)
    assert result.returncode == 0, f"ip {' '.join(args)}: {result.stderr}"


@contextlib.contextmanager
def network_namespace(resolv_conf: str | None = None) -> Iterator[Namespace]:
    """NS_ADDRESS in a new namespace, HOST_ADDRESS on this side, the namespace's default route
    through the pair: a process there finds NS_ADDRESS as its address, and reaches this
    machine's addresses through the pair. `resolv_conf`: its /etc/resolv.conf (`ip netns
    exec` mounts /etc/netns/NAME/resolv.conf over it)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2's `ip` for a network namespace")
    name = f"specctl-t{os.getpid()}"
    outer, inner = f"sct{os.getpid() % 100000}a", f"sct{os.getpid() % 100000}b"
    added = _ip("netns", "add", name)
    if added.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {added.stderr.strip()}")
    etc = Path("/etc/netns") / name
    try:
        if resolv_conf is not None:
            etc.mkdir(parents=True)
            (etc / "resolv.conf").write_text(resolv_conf)
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
        yield Namespace(name, HOST_ADDRESS, NS_ADDRESS)
    finally:
        _ip("link", "del", outer)  # takes its peer with it
        _ip("netns", "del", name)
        shutil.rmtree(etc, ignore_errors=True)


def has_default_route() -> bool:
    return bool(_ip("route", "show", "default").stdout.strip())
