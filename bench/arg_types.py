"""argparse types shared by the bench scripts: a bad value is a named usage error, not a
traceback."""

import argparse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_int_list(text: str) -> list[int]:
    """A comma-separated list of integers >= 1."""
    try:
        values = [int(n) for n in text.split(",")]
    except ValueError:
        message = f"not a comma-separated list of integers: {text!r}"
        raise argparse.ArgumentTypeError(message) from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return values
