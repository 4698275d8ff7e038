"""The serving process of a deployment: `specctl serve` started detached by `apply`, so the
endpoint outlives `apply` and the TUI. Its pid, endpoint and arguments are kept in
`server.json` under `$SPECCTL_HOME`; its output goes to `server.log`."""

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from daemon.specd.process_tree import end_session, session_pids

HEALTH_POLL_S = 0.25
STOP_GRACE_S = 15.0
LOG_TAIL_CHARS = 3000


class ServerProcessError(Exception):
    """The serving process did not start, did not become healthy, or would not stop."""


@dataclass(slots=True)
class ServerRecord:
    pid: int  # also its session id: it runs in a session of its own
    url: str  # http://host:port
    argv: list[str]
    fingerprint: str  # what it serves; a different one means restart it
    started_at: float = field(default_factory=time.time)

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)

    @staticmethod
    def load(path: Path) -> "ServerRecord | None":
        try:
            return ServerRecord(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def is_alive(self) -> bool:
        return bool(session_pids(self.pid))


def start_server(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> int:
    """Start `specctl <argv>` detached (own session, output to `log_path`); returns its pid."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "specctl.cli", *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    return process.pid


def wait_healthy(
    url: str, pid: int, timeout_s: float, log_path: Path, headers: dict[str, str] | None = None
) -> None:
    """Wait until `url`/health answers 200; fail early if the process exits."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0, headers=headers) as client:
        while time.monotonic() < deadline:
            if not session_pids(pid):
                raise ServerProcessError(
                    f"the serving process exited during start-up; its log ({log_path}) ends:\n"
                    + _tail(log_path)
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{url}/health").status_code == 200:
                    return
            time.sleep(HEALTH_POLL_S)
    raise ServerProcessError(
        f"the serving process did not become healthy within {timeout_s:g} s; "
        f"its log ({log_path}) ends:\n" + _tail(log_path)
    )


def stop_server(record: ServerRecord, grace_s: float = STOP_GRACE_S) -> list[int]:
    """SIGTERM the serving process's session, SIGKILL what is left; returns survivors."""
    return end_session(record.pid, grace_s)


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError:
        return "(no log)"
