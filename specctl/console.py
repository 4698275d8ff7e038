"""The rich console every command prints through."""

import sys

from rich.console import Console

PIPE_WIDTH = 160  # when output is not a terminal (CI logs, files), tables keep their columns


def make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, width=None if stream.isatty() else PIPE_WIDTH)
