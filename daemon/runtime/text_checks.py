"""Text a request may carry: valid Unicode, which a lone UTF-16 surrogate is not.

JSON may hold one ("\\ud800"), and so may a command-line argument or a path holding bytes that
are not UTF-8 (Python decodes them to lone surrogates). The tokenizer raised TypeError on such
text, and the UTF-8 byte counts of stop strings raised UnicodeEncodeError: every place that
takes text from outside checks it here first.
"""


def lone_surrogate_at(text: str) -> int | None:
    """The index of the first character of `text` that is a lone surrogate (None: valid)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def stop_string_problem(stop: str, max_bytes: int) -> str | None:
    """What is wrong with a stop string (None: nothing): empty, not valid Unicode, or longer
    than `max_bytes` in UTF-8 (the stop check looks back that far: engine/stop.py)."""
    if not stop:
        return "stop strings must not be empty"
    if lone_surrogate_at(stop) is not None:
        return f"stop string {stop[:32]!r} is not valid Unicode text"
    size = len(stop.encode("utf-8"))
    if size > max_bytes:
        return f"a stop string may be at most {max_bytes} bytes (UTF-8), got {size}"
    return None
