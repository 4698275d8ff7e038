"""Find and end the processes of one Ray node, by session id: never by name, so other Ray
clusters on the same machine are left alone.

`ray start` runs in a session of its own (start_new_session), so its GCS, raylet, agents and the
workers the raylet forks later all carry that session id even after `ray start` exits.
"""

import contextlib
import os
import signal
import time
from pathlib import Path

_PROC = Path("/proc")
POLL_INTERVAL_S = 0.1


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after the last ')'
    return text[text.rindex(")") + 2 :].split()


def process_start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks after boot (field 22 of /proc/PID/stat): fixed
    for the process's life, unlike a wall time derived from it, which moves when the clock is
    stepped (None: no such process). With the pid, it names one process for good."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def process_argv(pid: int) -> list[str] | None:
    """The process's command line (None: no such process, or not readable)."""
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def session_pids(session_id: int) -> list[int]:
    """Live (not zombie) processes whose session id is `session_id`."""
    pids = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        # fields[0] is the state, fields[3] the session id
        if fields and fields[0] != "Z" and int(fields[3]) == session_id:
            pids.append(int(entry.name))
    return pids


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def end_session(session_id: int, grace_s: float, kill_wait_s: float = 5.0) -> list[int]:
    """SIGTERM every process of the session, SIGKILL what is left after `grace_s`.

    Returns the pids still alive after the SIGKILL wait (empty on success)."""
    _signal_all(session_pids(session_id), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while session_pids(session_id) and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)
    _signal_all(session_pids(session_id), signal.SIGKILL)
    deadline = time.monotonic() + kill_wait_s
    while (left := session_pids(session_id)) and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)
    return left
