"""Runs a benchmark module (`python -m bench.<name>`) in a child process, as a user does."""

import subprocess
import sys


def run_bench_module(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
