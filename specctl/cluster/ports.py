"""Free loopback ports for the servers a local cluster starts (Ray's GCS, client server and
dashboard agent of each node), and for the tests' servers.

A port is chosen, released and only later bound by the server, so two things can take it in
between. The kernel hands a bind to port 0 out of its ephemeral range, where any process
binding port 0 (a Ray cluster starts dozens) may get it first: so ports come from below that
range, where only an explicit bind takes one. And a port released here may be handed out
again at once: `specctl demo` once gave a node's client server the port just chosen for the
head's GCS, and `ray start` refused ("client_server is trying to use a port number 42039 that
is used by other components"). So no port is handed out twice in a process, nor one noted as
in use (`reserve`: a head port read back from an earlier process's state).
"""

import random
import socket
import threading
from pathlib import Path

from daemon.specd.config import RAY_WORKER_PORTS

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = RAY_WORKER_PORTS.stop  # above Ray's worker ports (10002-19999 by default)
TRIES = 100

_lock = threading.Lock()
_handed_out: set[int] = set()


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


def reserve(port: int) -> None:
    """Note `port` as in use: `free_port` will not hand it out in this process."""
    with _lock:
        _handed_out.add(port)


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range where it has room (else
    from it), never one of Ray's worker ports, nor one this process handed out or reserved
    before."""
    high = _ephemeral_low()
    with _lock:
        if high - LOWEST >= 1000:
            for _ in range(TRIES):
                port = random.randrange(LOWEST, high)
                if port not in _handed_out and _bindable(port):
                    _handed_out.add(port)
                    return port
        for _ in range(TRIES):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            # an ephemeral range that reaches down into Ray's worker ports (10000-65535, say)
            if port not in _handed_out and port not in RAY_WORKER_PORTS:
                _handed_out.add(port)
                return port
    raise OSError(f"no free loopback port found in {TRIES} tries")
