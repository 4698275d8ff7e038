"""Keep the deployment's serving process as `state.json` asks: leave a healthy one started
for the same fingerprint alone, replace any other."""

import httpx

from daemon.specd.process_tree import process_start_ticks
from specctl.apply.events import ApplyEvents
from specctl.apply.state import AppliedState
from specctl.deploy.server_process import (
    ServerRecord,
    start_server,
    stop_server,
    wait_healthy,
)
from specctl.home import SpecctlHome

HEALTH_CHECK_TIMEOUT_S = 5.0


def ensure_server(
    home: SpecctlHome, state: AppliedState, events: ApplyEvents, timeout_s: float
) -> bool:
    """True when the serving process was (re)started."""
    assert state.server is not None
    url = state.server.url
    record = ServerRecord.load(home.server_file)
    if record is not None and record.is_alive():
        if record.fingerprint == state.server.fingerprint and _healthy(url):
            events.step("server", "skipped", f"already serving at {url}/v1")
            return False
        events.step("server", "started", "replacing the serving process")
        stop_server(record)
    events.step("server", "started", f"{url}/v1")
    argv = ["serve", "--deployment", str(home.state_file)]
    pid = start_server(argv, home.server_log)
    record = ServerRecord(pid, url, argv, state.server.fingerprint)
    record.start_ticks = process_start_ticks(pid)
    record.save(home.server_file)
    try:
        wait_healthy(url, pid, timeout_s, home.server_log)
    except Exception as exc:
        events.step("server", "failed", str(exc).splitlines()[0])
        raise
    events.step("server", "done", f"serving at {url}/v1 (pid {pid}, log {home.server_log})")
    return True


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=HEALTH_CHECK_TIMEOUT_S).status_code == 200
    except httpx.HTTPError:
        return False
