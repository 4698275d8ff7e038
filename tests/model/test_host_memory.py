"""A CPU runner keeps freed host memory: a second pass's logits reuse the first's pages."""

import os
import subprocess
import sys

import pytest

# One logits tensor of a verify pass at Qwen's vocabulary (80 rows x 151,936 float32, 48.6 MB,
# above glibc's largest mmap threshold), allocated, written and freed again and again as the
# passes of a run do. The heap first grows to its working size while small allocations settle
# around the big block: for the first few passes a freed block is fenced in by small chunks
# above it and a new one is carved from fresh pages (seen here: up to the 6th pass, once later
# in CI; now and then one early pass between them reuses its block). So warm up until 3 passes
# in a row each fault in fewer than 200 pages (at most 40 passes; with glibc's defaults none
# does), then count the minor page faults of 9 more passes: their median.
CHILD = """
import resource, statistics, torch
from daemon.runtime.model.host_memory import keep_freed_host_memory
applied = keep_freed_host_memory()
def one_pass():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.empty(80, 151_936)
    x.fill_(1.0)
    del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
settled = 0
for _ in range(40):
    settled = settled + 1 if one_pass() < 200 else 0
    if settled == 3:
        break
faults = [one_pass() for _ in range(9)]
print(int(applied), int(settled == 3), int(statistics.median(faults)))
"""


def run_child(keep: str) -> tuple[bool, bool, int]:
    env = {**os.environ, "SPECCTL_KEEP_HOST_MEMORY": keep}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    applied, settled, faults = out.stdout.split()[-3:]
    return applied == "1", settled == "1", int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_logits_are_reused_without_page_faults() -> None:
    applied, settled, faults = run_child("1")
    assert applied
    assert settled, "the heap never settled: no 3 passes in a row reused their block"
    assert faults < 200  # the freed block is reused: its pages are already resident


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_switched_off_leaves_glibc_defaults() -> None:
    applied, _, faults = run_child("0")
    assert not applied
    assert faults > 10_000  # a fresh mmap each pass: its ~11,900 pages faulted in again
