"""Keep the deployment's serving process as `state.json` asks: leave a healthy one started
for the same fingerprint alone, replace any other."""

import socket

import httpx

from daemon.specd.process_tree import process_start_ticks
from specctl.apply.events import ApplyEvents
from specctl.apply.state import AppliedState, ServerState
from specctl.deploy.server_process import (
    ServerProcessError,
    ServerRecord,
    start_server,
    stop_server,
    wait_healthy,
)
from specctl.home import SpecctlHome

HEALTH_CHECK_TIMEOUT_S = 5.0


def ensure_server(
    home: SpecctlHome,
    state: AppliedState,
    events: ApplyEvents,
    timeout_s: float,
    new_cluster: bool = False,
) -> bool:
    """True when the serving process was (re)started. `new_cluster`: the Ray head was
    started again (its old one had died), and a serving process that joined the old one is
    replaced: it held the old GCS's shard handles and answered every request with a 503."""
    assert state.server is not None
    url = state.server.url
    record = ServerRecord.load(home.server_file)
    alive = record is not None and record.is_alive()
    same = alive and record is not None and record.fingerprint == state.server.fingerprint
    if same and not new_cluster and _healthy(url):
        events.step("server", "skipped", f"already serving at {url}/v1")
        return False
    if not (alive and record is not None and record.url == url):  # not its address
        try:  # apply checked it first; taken since?
            check_bindable(state.server.host, state.server.port)
        except ServerProcessError as exc:
            events.step("server", "failed", str(exc))
            raise
    if alive and record is not None:
        events.step("server", "started", "replacing the serving process")
        stop_server(record)
    events.step("server", "started", f"{url}/v1")
    argv = ["serve", "--deployment", str(home.state_file)]
    log_start = home.server_log.stat().st_size if home.server_log.exists() else 0
    pid = start_server(argv, home.server_log)
    record = ServerRecord(pid, url, argv, state.server.fingerprint)
    record.start_ticks = process_start_ticks(pid)
    record.save(home.server_file)
    try:
        wait_healthy(url, pid, timeout_s, home.server_log, start=log_start)
    except Exception as exc:
        events.step("server", "failed", str(exc).splitlines()[0])
        raise
    events.step("server", "done", f"serving at {url}/v1 (pid {pid}, log {home.server_log})")
    return True


def check_server_address(home: SpecctlHome, host: str, port: int) -> None:
    """check_bindable, unless the serving process of this home runs at that address."""
    record = ServerRecord.load(home.server_file)
    url = ServerState(host, port, None, 0, "").url
    if record is None or not record.is_alive() or record.url != url:
        check_bindable(host, port)


def check_bindable(host: str, port: int) -> None:
    """Raise ServerProcessError unless `host:port` can be listened on now. Checked before a
    serving process is stopped or started: another program on the port answered the new
    server's health checks (it had failed to bind), and a move to a taken port stopped the
    working server first."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ServerProcessError(
                f"cannot serve on {host}:{port}: {exc.strerror or exc} (another program "
                "listens there, or the address is not this machine's); choose another [server] "
                "host or port. The serving process was left as it was"
            ) from None


def _healthy(url: str) -> bool:
    """Whether the serving process answers as up: ready, or `degraded` (up, while no
    verifier could serve at its watcher's last look: one apply just replaced, which it finds
    within a few seconds; restarted for that, it lost its history and in-flight requests)."""
    try:
        response = httpx.get(f"{url}/health", timeout=HEALTH_CHECK_TIMEOUT_S)
    except httpx.HTTPError:
        return False
    if response.status_code == 200:
        return True
    try:
        return response.status_code == 503 and response.json().get("status") == "degraded"
    except ValueError:
        return False
