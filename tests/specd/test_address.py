"""host:port addresses as specd and apply compare them (daemon/specd/address.py)."""

import pytest

from daemon.specd.address import is_loopback, same_address


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("localhost", True),
        ("LocalHost", True),
        ("10.0.0.11", False),
        ("0.0.0.0", False),
        ("spark.local", False),
        ("localhost.example", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("127.0.0.1:6379", "127.0.0.1:6379", True),
        ("localhost:6379", "127.0.0.1:6379", True),
        ("localhost:6379", "[::1]:6379", True),
        ("[2001:db8::1]:6379", "[2001:DB8:0:0::1]:6379", True),
        ("[::1]:6379", "127.0.0.1:6379", False),  # two loopback addresses, two sockets
        ("127.0.0.2:6379", "127.0.0.1:6379", False),
        ("Spark.Local:6379", "spark.local:6379", True),
        ("127.0.0.1:6379", "127.0.0.1:6380", False),
        ("10.0.0.11:6379", "127.0.0.1:6379", False),  # names and addresses are not resolved
        ("spark.local:6379", "10.0.0.11:6379", False),
    ],
)
def test_same_address(a: str, b: str, same: bool) -> None:
    assert same_address(a, b) is same
    assert same_address(b, a) is same
