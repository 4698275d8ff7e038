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

from daemon.specd.process_tree import end_session, process_argv, process_start_ticks, session_pids

HEALTH_POLL_S = 0.25
STOP_GRACE_S = 15.0
LOG_TAIL_CHARS = 3000


class ServerProcessError(Exception):
    """The serving process did not start, did not become healthy, or would not stop."""


class ServerRecordError(ServerProcessError):
    """server.json is there but cannot be trusted; the message names it and says why."""


@dataclass(slots=True)
class ServerRecord:
    pid: int  # also its session id: it runs in a session of its own
    url: str  # http://host:port
    argv: list[str]
    fingerprint: str  # what it serves; a different one means restart it
    started_at: float = field(default_factory=time.time)
    # its start in clock ticks after boot (process_start_ticks), read as it started: with the
    # pid, what tells it from a later process given the same pid (None: an older record)
    start_ticks: int | None = None

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)

    @staticmethod
    def load(path: Path) -> "ServerRecord | None":
        """The record, None where there is none; ServerRecordError where the file is not one
        (its pid is what `down` signals: a pid of 0 is every process outside a session, and
        a damaged file deleted as if nothing ran left the server running)."""
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ServerRecordError(_unusable(path, f"cannot read it ({exc})")) from None
        if not isinstance(raw, dict):
            raise ServerRecordError(_unusable(path, "not a JSON object"))
        checks = {
            "pid": lambda v: type(v) is int and v > 1,
            "url": lambda v: isinstance(v, str),
            "argv": lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v),
            "fingerprint": lambda v: isinstance(v, str),
            "started_at": lambda v: type(v) in (int, float),
            "start_ticks": lambda v: v is None or (type(v) is int and v >= 0),
        }
        raw.setdefault("start_ticks", None)  # written by specctl before it had the field
        for name, check in checks.items():
            if name not in raw or not check(raw[name]):
                shown = "missing" if name not in raw else repr(raw[name])
                raise ServerRecordError(_unusable(path, f"field {name}: {shown}"))
        return ServerRecord(**{name: raw[name] for name in checks})

    def session(self) -> list[int]:
        """The live processes of the serving process's session; none where its pid now
        belongs to another program (the server ended and the pid was reused: a session leader
        of the pid that is not `specctl serve`, or one that started at another tick)."""
        pids = session_pids(self.pid)
        if self.pid in pids and not self._is_ours():
            return []
        return pids

    def is_alive(self) -> bool:
        return bool(self.session())

    def _is_ours(self) -> bool:
        argv = process_argv(self.pid) or []
        if "specctl.cli" not in argv or "serve" not in argv:
            return False
        return self.start_ticks is None or process_start_ticks(self.pid) == self.start_ticks


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
    url: str,
    pid: int,
    timeout_s: float,
    log_path: Path,
    headers: dict[str, str] | None = None,
    start: int = 0,
) -> None:
    """Wait until `url`/health answers 200 from process `pid` (another program on the port
    answered for a server that had failed to bind it); fail early if the process exits. An
    error quotes the log from byte `start` (what this start wrote to a log shared with the
    processes before it)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0, headers=headers) as client:
        while time.monotonic() < deadline:
            if not session_pids(pid):
                raise ServerProcessError(
                    f"the serving process exited during start-up; its log ({log_path}) ends:\n"
                    + _tail(log_path, since=start)
                )
            with contextlib.suppress(httpx.HTTPError, ValueError):
                answer = client.get(f"{url}/health")
                if answer.status_code == 200 and answer.json().get("pid") == pid:
                    return
            time.sleep(HEALTH_POLL_S)
    raise ServerProcessError(
        f"the serving process did not become healthy within {timeout_s:g} s; "
        f"its log ({log_path}) ends:\n" + _tail(log_path, since=start)
    )


def stop_server(record: ServerRecord, grace_s: float = STOP_GRACE_S) -> list[int]:
    """SIGTERM the serving process's session, SIGKILL what is left; returns survivors. Nothing
    where the session is gone or its pid is another program's now (ServerRecord.session)."""
    if not record.session():
        return []
    return end_session(record.pid, grace_s)


def _unusable(path: Path, why: str) -> str:
    return (
        f"{path}: not a serving-process record: {why}. Stop the `specctl serve` it was "
        "written for, if one still runs, and remove the file"
    )


def _tail(path: Path, since: int = 0) -> str:
    try:
        with path.open("rb") as log:
            log.seek(since)
            return log.read().decode(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError:
        return "(no log)"
