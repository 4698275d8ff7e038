"""How fast `specctl` opens: the real command in a real pseudo-terminal (80x24), timed from
launch to the first frame (the mode bar drawn) and to the nodes listed (the cluster file read
and this machine's inventory shown), then quit with Ctrl+Q. Also `specctl --help`, the
floor any command pays (interpreter and CLI start-up). Figures side by side, one run.

    .venv/bin/python bench/tui_startup.py [--runs 5] [--config examples/local.toml]
"""

import argparse
import contextlib
import fcntl
import os
import pty
import re
import select
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ANSI = re.compile(
    rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[()][0-9A-Za-z]"
)
FIRST_FRAME = b"1 Nodes"
NODES_LISTED = b"all reachable"
TIMEOUT_S = 30.0


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def time_tui(config: Path, home: Path) -> tuple[float, float]:
    """Seconds from launch to the first frame, and to the nodes listed."""
    command = [sys.executable, "-m", "specctl.cli", str(config)]
    env = {**os.environ, "TERM": "xterm-256color", "SPECCTL_HOME": str(home)}
    started = time.perf_counter()
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(sys.executable, command, env)
    _set_size(fd, 24, 80)
    screen, marks = b"", {}
    try:
        while len(marks) < 2 and time.perf_counter() - started < TIMEOUT_S:
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready:
                screen += os.read(fd, 65536)
                text = ANSI.sub(b"", screen)
                for name, needle in (("frame", FIRST_FRAME), ("nodes", NODES_LISTED)):
                    if name not in marks and needle in text:
                        marks[name] = time.perf_counter() - started
        os.write(fd, b"\x11")  # Ctrl+Q
        _wait_exit(pid, fd)
    finally:
        os.close(fd)
    if len(marks) < 2:
        raise RuntimeError(f"the TUI did not show {sorted({'frame', 'nodes'} - set(marks))}")
    return marks["frame"], marks["nodes"]


def _wait_exit(pid: int, fd: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        with_output, _, _ = select.select([fd], [], [], 0.05)
        if with_output:
            with contextlib.suppress(OSError):
                os.read(fd, 65536)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def time_help() -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "specctl.cli", "--help"],
        capture_output=True,
        check=True,
        timeout=TIMEOUT_S,
    )
    return time.perf_counter() - started


def summary(values: list[float]) -> str:
    return (
        f"median {statistics.median(values) * 1000:6.0f} ms   "
        f"min {min(values) * 1000:6.0f}   max {max(values) * 1000:6.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--config", type=Path, default=REPO / "examples" / "local.toml")
    args = parser.parse_args()
    frames, nodes, helps = [], [], []
    with tempfile.TemporaryDirectory(prefix="specctl-bench-") as home:
        time_tui(args.config, Path(home))  # warm the file cache: every run below reads alike
        for _ in range(args.runs):
            frame_s, nodes_s = time_tui(args.config, Path(home))
            frames.append(frame_s)
            nodes.append(nodes_s)
            helps.append(time_help())
    print(f"specctl TUI start-up, {args.runs} runs, 80x24 pty, {args.config.name}")
    print(f"  specctl --help (CLI floor)   {summary(helps)}")
    print(f"  first frame (mode bar)       {summary(frames)}")
    print(f"  nodes listed (file read)     {summary(nodes)}")


if __name__ == "__main__":
    main()
