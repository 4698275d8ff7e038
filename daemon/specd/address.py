"""Parse and check `host:port` addresses of a Ray head."""

import ipaddress
import re
import socket

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
    """Whether a TCP connection to host:port opens within `timeout_s`."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except (OSError, UnicodeError):
        return False
