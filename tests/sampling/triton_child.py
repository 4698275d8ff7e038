"""Whether this pytest process is the TRITON_INTERPRET=1 child started by
test_rejection_kernel.py (triton reads that variable when a kernel is decorated, so it must be
set before anything imports triton: a fresh process is the only robust place)."""

import os

KERNEL_CHILD_ENV = "SPECCTL_TEST_TRITON_INTERPRETED"


def is_kernel_child() -> bool:
    return os.environ.get(KERNEL_CHILD_ENV) == "1" and os.environ.get("TRITON_INTERPRET") == "1"
