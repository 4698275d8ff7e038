"""Suite-wide settings."""

import os
import sys

import pytest
import torch

# Tests share two cores with the subprocesses they start (Ray nodes, specd, CLI runs); one
# intra-op thread avoids oversubscription, which slows tiny-model passes down several times.
torch.set_num_threads(1)

_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave without interpreter teardown once pytest has reported (see specctl/quiet_exit.py:
    triton, imported through transformers, prints hundreds of binding-leak lines at teardown,
    which would bury pytest's summary line)."""
    if _exit_status and os.environ.get("SPECCTL_TEST_FULL_TEARDOWN") != "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])
