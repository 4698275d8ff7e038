"""Process exit without interpreter teardown.

transformers imports torch.compiler, which imports triton; at interpreter teardown triton's
nanobind bindings print hundreds of "leaked function" lines to stderr, which read like a crash.
Commands that are done flush their output and leave with os._exit instead. Anything that must
run at exit (Ray shutdown, closing files) is done explicitly before this is called.
"""

import os
import sys
from collections.abc import Callable


def run_and_exit(entry: Callable[[], object]) -> None:
    """Run a CLI entry point, then exit with its status, skipping interpreter teardown."""
    code = 0
    try:
        entry()
    except SystemExit as exc:
        if isinstance(exc.code, int):
            code = exc.code
        elif exc.code is not None:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = 130
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
