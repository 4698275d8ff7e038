"""User-facing errors of the shard runtime.

Every error a user can cause (bad model directory, bad dtype, bad request parameter) is a
`SpecError` subclass whose message says what is wrong and where. The CLI prints the message and
exits non-zero; it never shows a traceback for these.
"""


class SpecError(Exception):
    """Base class: an error caused by input, with a message fit to show a user."""


class ModelLoadError(SpecError):
    """A model directory cannot be loaded (missing files, unsupported dtype or architecture)."""


class IncompatibleModelsError(SpecError):
    """Draft and target cannot be paired (different vocabularies)."""


class RequestError(SpecError):
    """A generation request is invalid (prompt too long, parameter out of range)."""


class EngineOverloadedError(SpecError):
    """The engine's queue is full; the request was not accepted (retry later)."""


class EngineStoppedError(SpecError):
    """The engine is shutting down or has failed; it accepts no more requests."""
