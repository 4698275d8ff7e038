"""Join a Ray cluster as a driver, with the cluster token, within a bounded time."""

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from daemon.specd.address import is_reachable, parse_address
from daemon.specd.ray_command import AUTH_ENV

NAMESPACE = "specctl"  # every shard actor is named in this namespace
CONNECT_CHECK_TIMEOUT_S = 3.0
# A refused or unreachable driver retries the GCS once a second, 20 times by default.
GCS_RETRIES = "5"


class RayConnectError(Exception):
    """The cluster cannot be joined; the message says why."""


def connect(address: str, token_file: Path, namespace: str = NAMESPACE) -> None:
    """`ray.init` as a driver of the cluster at `address` (host:port of its GCS), token auth
    on. Idempotent within a process connected to the same cluster."""
    import ray

    if ray.is_initialized():
        return
    try:
        host, port = parse_address(address)
    except ValueError as exc:
        raise RayConnectError(f"Ray head address: {exc}") from None
    if not is_reachable(host, port, CONNECT_CHECK_TIMEOUT_S):
        raise RayConnectError(f"Ray head {address} is unreachable (no TCP connection)")
    if not token_file.is_file():
        raise RayConnectError(f"{token_file}: cluster token file not found")
    os.environ.update(AUTH_ENV)
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_file)
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ.setdefault("RAY_NUM_REDIS_GET_RETRIES", GCS_RETRIES)
    _reload_auth_settings()
    try:
        with _own_signal_handlers():
            ray.init(
                address=address,
                namespace=namespace,
                log_to_driver=False,
                logging_level="ERROR",
                configure_logging=False,
            )
    except Exception as exc:  # Ray raises many kinds here (auth, version, connection)
        raise RayConnectError(f"cannot join the Ray cluster at {address}: {exc}") from None


def _reload_auth_settings() -> None:
    """Ray reads the auth mode and token once per process and caches them: when ray was
    imported before the variables above were set, make it read them again."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def disconnect() -> None:
    import ray

    if ray.is_initialized():
        with _own_signal_handlers():
            ray.shutdown()


@contextlib.contextmanager
def _own_signal_handlers() -> Iterator[None]:
    """The process's SIGTERM and SIGINT handlers as they were: `ray.init` replaces SIGTERM's
    with one that exits at once, and `ray.shutdown` leaves the default (the end of the
    process), where `apply --watch` asked to finish its apply first. Main thread only (the
    only one that may set them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    import ray._private.utils as ray_utils

    kept = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    # while ray.init runs, its SIGTERM handler would end the process at once: where the
    # process has one of its own, Ray's is not set at all (it sets it through this function)
    installs = getattr(ray_utils, "set_sigterm_handler", None)
    if installs is not None and kept[signal.SIGTERM] not in (signal.SIG_DFL, None):
        ray_utils.set_sigterm_handler = lambda _handler: None
    try:
        yield
    finally:
        if installs is not None:
            ray_utils.set_sigterm_handler = installs
        for number, handler in kept.items():
            if handler is not None:
                signal.signal(number, handler)
