"""A reachability check's timeout covers resolving the name too: in a network namespace whose
only name server never answers, `is_reachable` gives up within its timeout, where the resolver
alone takes its own (3 s a try here). specd checks a worker's head with it while it holds
its start lock; `specctl deploy` checks the cluster's address with it.

Needs root and `ip netns`; skipped where either is missing."""

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from .netns import SILENT_ADDRESS, Namespace, network_namespace

pytestmark = pytest.mark.timeout(120)

RESOLVER_TRY_S = 3
RESOLVER_TRIES = 2
CHECK_TIMEOUT_S = 1.0
NAME = "head.specctl-test.invalid"  # not in /etc/hosts: only the name server could answer

SCRIPT = textwrap.dedent(
    """
    import socket, sys, time
    from daemon.specd.address import is_reachable
    started = time.monotonic()
    if sys.argv[1] == "resolver":
        try:
            socket.getaddrinfo(sys.argv[2], 6379)
        except OSError as exc:
            print(type(exc).__name__, file=sys.stderr)
    else:
        print(is_reachable(sys.argv[2], 6379, float(sys.argv[3])))
    print(round(time.monotonic() - started, 2))
    """
)


@pytest.fixture(scope="module")
def silent_resolver() -> Iterator[Namespace]:
    conf = f"nameserver {SILENT_ADDRESS}\n"
    conf += f"options timeout:{RESOLVER_TRY_S} attempts:{RESOLVER_TRIES}\n"
    with network_namespace(resolv_conf=conf) as namespace:
        yield namespace


def _run(namespace: Namespace, *args: str) -> list[str]:
    result = subprocess.run(
        [*namespace.exec_prefix(), sys.executable, "-c", SCRIPT, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_a_name_the_resolver_never_answers_is_unreachable_within_the_timeout(
    silent_resolver: Namespace,
) -> None:
    (seconds,) = _run(silent_resolver, "resolver", NAME)
    assert float(seconds) >= RESOLVER_TRY_S  # the resolver alone: its own timeouts
    reachable, seconds = _run(silent_resolver, "check", NAME, str(CHECK_TIMEOUT_S))
    assert reachable == "False"
    assert float(seconds) < CHECK_TIMEOUT_S + 1.0, seconds


def test_an_address_needs_no_resolver(silent_resolver: Namespace) -> None:
    """An IP address is dialled at once: nothing listens at the pair's far side's port, so
    the check fails fast, without asking the silent name server."""
    reachable, seconds = _run(silent_resolver, "check", silent_resolver.host_address, "5")
    assert reachable == "False" and float(seconds) < 2.0, seconds
