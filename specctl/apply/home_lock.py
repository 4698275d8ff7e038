"""One `apply` or `down` at a time per home.

Two applies at once (two terminals, the TUI and a script) each read the same state file,
started and stopped the same nodes and shards, and the one that saved last recorded a
deployment the other had half replaced. The lock is an flock on a file in the home: the
kernel lets it go when its holder exits, however it exits, so a killed apply leaves no
stale lock behind. The holder writes its pid and what it does into the file, for the error
the next one gets.
"""

import contextlib
import fcntl
import os
from collections.abc import Iterator

from specctl.home import SpecctlHome

LOCK_FILE_NAME = "apply.lock"


class HomeBusyError(Exception):
    """Another apply or down holds the home's lock; the message names its pid."""


@contextlib.contextmanager
def home_lock(home: SpecctlHome, what: str) -> Iterator[None]:
    """Hold the home's lock for `what` ("apply", "down"), or raise HomeBusyError at once.
    Not reentrant, within one process either (each holder opens the file anew). A home not
    made yet has nothing to guard (and is not made for the lock)."""
    if not home.root.is_dir():
        yield
        return
    path = home.root / LOCK_FILE_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            raise HomeBusyError(
                f"another specctl is changing the deployment under {home.root} ({holder}); "
                f"wait for it to finish, then {what} again"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{what}, pid {os.getpid()}".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
