"""The store's errors: each message names the file and says what is wrong."""


class StoreError(Exception):
    """The store cannot be used: not a specctl store, a newer schema, a bad location, ..."""


class StoreBusyError(StoreError):
    """A reader gave up waiting for a lock (it waits at most a quarter second, never seconds).

    Callers that refresh periodically (the TUI, `specctl status --watch`) keep what they last
    showed and try again on the next tick.
    """
