"""A CPU runner keeps freed host memory: a second pass's logits reuse the first's pages."""

import os
import subprocess
import sys

import pytest

# One logits tensor of a verify pass at Qwen's vocabulary (80 rows x 151,936 float32, 48.6 MB,
# above glibc's largest mmap threshold), allocated, written and freed again and again as the
# passes of a run do: the minor page faults of each of 7 such passes after 3 warm-up ones (the
# heap grows to its working size while small allocations settle around the big block), and
# their median: now and then one pass gets a fresh block and faults all of it in (seen in 1
# run of 3; likely glibc serving it from another arena), which a total over the passes counts.
CHILD = """
import resource, statistics, torch
from daemon.runtime.model.host_memory import keep_freed_host_memory
applied = keep_freed_host_memory()
def one_pass():
    x = torch.empty(80, 151_936)
    x.fill_(1.0)
for _ in range(3):
    one_pass()
faults = []
for _ in range(7):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    one_pass()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(int(applied), int(statistics.median(faults)))
"""


def run_child(keep: str) -> tuple[bool, int]:
    env = {**os.environ, "SPECCTL_KEEP_HOST_MEMORY": keep}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    applied, faults = out.stdout.split()[-2:]
    return applied == "1", int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_logits_are_reused_without_page_faults() -> None:
    applied, faults = run_child("1")
    assert applied
    assert faults < 200  # the freed block is reused: its pages are already resident


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_switched_off_leaves_glibc_defaults() -> None:
    applied, faults = run_child("0")
    assert not applied
    assert faults > 10_000  # a fresh mmap each pass: its ~11,900 pages faulted in again
