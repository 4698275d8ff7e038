"""The store's errors: each message names the file and says what is wrong."""


class StoreError(Exception):
    """The store cannot be used: not a specctl store, a newer schema, a bad location, ..."""


class StoreBusyError(StoreError):
    """A reader gave up waiting for a lock (it waits at most a quarter second, never seconds).

    Callers that refresh periodically (the TUI, `specctl status --watch`) keep what they last
    showed and try again on the next tick.
    """


class RowsRefusedError(StoreError):
    """Some rows of a flush were refused by the store (a NaN in a NOT NULL column) and dropped;
    the others were written (`written`)."""

    def __init__(self, message: str, written: int) -> None:
        super().__init__(message)
        self.written = written
