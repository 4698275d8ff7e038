"""The TRITON_INTERPRET=1 child runs of the Triton kernels' tests (test_rejection_kernel.py,
test_gumbel_kernel.py). Triton reads that variable when a kernel is decorated, so it must be
set before anything imports triton: a fresh pytest process is the only robust place. The parent
test starts the child with `run_interpreted_child`; kernel-only tests skip unless
`is_kernel_child()`."""

import os
import subprocess
import sys

import pytest

KERNEL_CHILD_ENV = "SPECCTL_TEST_TRITON_INTERPRETED"
CHILD_TIMEOUT_S = 300


def is_kernel_child() -> bool:
    return os.environ.get(KERNEL_CHILD_ENV) == "1" and os.environ.get("TRITON_INTERPRET") == "1"


def run_interpreted_child(files: list[str], select: str) -> None:
    """pytest on `files` (the tests `-k select` picks) in a fresh process with the kernels
    interpreted; fails with the child's output unless it passed and skipped nothing."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", KERNEL_CHILD_ENV: "1"}
    result = subprocess.run(
        # -o addopts=: one process, not the suite's workers
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         "-k", select, "-W", "ignore::RuntimeWarning", *files],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
