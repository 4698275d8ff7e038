"""Parse and check `host:port` addresses of a Ray head."""

import ipaddress
import re
import socket
import threading
import time
from typing import Any

_DNS_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_DNS_LABEL}(\.{_DNS_LABEL})*")


def is_host_name(text: str) -> bool:
    """Whether `text` is a DNS host name (dot-separated labels of letters, digits and inner
    hyphens, 253 characters at most, the last not all digits: "256.1.1.1" is a bad address,
    not a name)."""
    return _HOSTNAME.fullmatch(text) is not None and not text.rsplit(".", 1)[-1].isdigit()


def check_host(host: str) -> str:
    """`host` if it is an IP address or a host name; else ValueError saying so (the rule of
    every address specctl and specd bind or dial)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not is_host_name(host):
            raise ValueError(f"{host!r} is neither an IP address nor a host name") from None
    return host


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine's loopback ("localhost", 127.0.0.0/8, ::1): an
    address only processes on the same machine can dial."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def same_address(a: str, b: str) -> bool:
    """Whether two host:port addresses name the same endpoint as written: equal ports, and
    hosts equal as IP addresses (IPv6 in any spelling), as names but for case, or one of them
    "localhost" and the other 127.0.0.1 or ::1. Names are not resolved."""
    (host_a, port_a), (host_b, port_b) = parse_address(a), parse_address(b)
    return port_a == port_b and bool(_spellings(host_a) & _spellings(host_b))


def _spellings(host: str) -> set[str]:
    host = host.lower()
    if host == "localhost":
        return {"localhost", "127.0.0.1", "::1"}
    try:
        return {str(ipaddress.ip_address(host))}
    except ValueError:
        return {host}


def parse_address(text: str) -> tuple[str, int]:
    """Split 'host:port' ('[v6]:port' for IPv6); raise ValueError saying what is wrong."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r} is not of the form host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address") from None
    elif not _is_ipv4(host) and not is_host_name(host):
        raise ValueError(f"{host!r} is neither an IP address nor a host name")
    if not port_text.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"port {port_text!r} is not a number from 1 to 65535")
    return host, int(port_text)


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def is_reachable(host: str, port: int, timeout_s: float) -> bool:
    """Whether a TCP connection to host:port opens within `timeout_s`, the name's resolution
    included. socket.create_connection's timeout covers the connection only: a name whose
    name server does not answer took the resolver's own timeouts (5 s a try, two tries, per
    server in resolv.conf), while the node's start lock was held."""
    deadline = time.monotonic() + timeout_s
    try:
        addresses = _resolve(host, port, timeout_s)
    except (OSError, UnicodeError, TimeoutError):
        return False
    for family, kind, proto, _, address in addresses:
        left = deadline - time.monotonic()
        if left <= 0.0:
            return False
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(left)
                sock.connect(address)
                return True
        except OSError:
            continue
    return False


def _resolve(host: str, port: int, timeout_s: float) -> list[tuple[Any, ...]]:
    """socket.getaddrinfo for a TCP connection, within `timeout_s` (TimeoutError past it).
    An IP address needs no resolver; a name is resolved in a thread of its own, left to
    finish on its own where it takes too long (getaddrinfo cannot be interrupted)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    result: list[list[tuple[Any, ...]] | BaseException] = []
    done = threading.Event()

    def resolve() -> None:
        try:
            result.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except BaseException as exc:  # handed to the caller
            result.append(exc)
        done.set()

    threading.Thread(target=resolve, name=f"resolve {host}", daemon=True).start()
    if not done.wait(timeout_s):
        raise TimeoutError(f"{host}: no answer from the resolver in {timeout_s:g} s")
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]
