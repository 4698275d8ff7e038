"""Loopback ports for the servers tests start."""

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20000  # above Ray's worker ports (10002-19999 by default)


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range. A port bind(0) hands out is
    from that range, and any process binding port 0 (a Ray cluster starts dozens) may get
    it between this choice and the server's own bind: a test's server then failed with
    "address already in use". Below the range only an explicit bind takes a port."""
    high = _ephemeral_low()
    if high - LOWEST >= 1000:
        for _ in range(100):
            port = random.randrange(LOWEST, high)
            if _bindable(port):
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
