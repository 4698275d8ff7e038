"""Suite-wide settings."""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

# Tests share two cores with the subprocesses they start (Ray nodes, specd, CLI runs); one
# intra-op thread avoids oversubscription, which slows tiny-model passes down several times.
torch.set_num_threads(1)

_exit_status: list[int] = []

# The suite runs in pytest-xdist workers (addopts in pyproject.toml), each a process of its own
# started by the one that reports: what belongs to the whole run is made and cleared there.
_IS_WORKER = "PYTEST_XDIST_WORKER" in os.environ

# Model loads of this run, and of the processes it starts, see each other through a ledger of
# their own (daemon/runtime/model/load_ledger.py): loads of another run on this machine must
# not change what a test's memory check says. The workers inherit the run's ledger, so loads in
# two workers at once see each other, as two shards on one machine do.
if not _IS_WORKER or "SPECCTL_LOAD_LEDGER" not in os.environ:
    os.environ["SPECCTL_LOAD_LEDGER"] = tempfile.mkdtemp(prefix="specctl-loads-test-")
    # also where pytest stops before the session (a wrong option): sessionfinish never runs
    atexit.register(shutil.rmtree, os.environ["SPECCTL_LOAD_LEDGER"], ignore_errors=True)
_LOAD_LEDGER = os.environ["SPECCTL_LOAD_LEDGER"]

# Local Ray nodes keep a short root under /tmp per $SPECCTL_HOME (specctl/home.py), which
# `down` leaves for its logs: one per test home, ~30 a run, were left behind
_RAY_ROOTS = f"specctl-{os.getuid()}-*"
_ray_roots_before = set(Path("/tmp").glob(_RAY_ROOTS))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))
    if _IS_WORKER:  # the other worker may still be starting a node under a new root
        return
    shutil.rmtree(_LOAD_LEDGER, ignore_errors=True)
    from tests.distributed.ray_cluster import ray_processes_under

    for root in set(Path("/tmp").glob(_RAY_ROOTS)) - _ray_roots_before:
        if not ray_processes_under(root):  # one still in use is a leak the tests report
            shutil.rmtree(root, ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave without interpreter teardown once pytest has reported (see specctl/quiet_exit.py:
    triton, imported through transformers, prints hundreds of binding-leak lines at teardown,
    which would bury pytest's summary line)."""
    if _exit_status and os.environ.get("SPECCTL_TEST_FULL_TEARDOWN") != "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])
