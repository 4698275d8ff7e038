"""Unknown request fields are logged once each, within bounds: the names are the client's."""

import logging

import pytest

from specctl.server.app import (
    MAX_WARNED_FIELDS,
    MAX_WARNED_NAMES,
    AppOptions,
    ServingState,
)


def test_names_are_told_once_each_and_the_memory_of_them_is_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = ServingState(AppOptions("m"))
    with caplog.at_level(logging.WARNING, logger="specctl.serve"):
        state.warn_ignored(["a", "b", "a"])
        state.warn_ignored(["a", "b"])  # told already
        for i in range(300):  # a client inventing a new name with every request
            state.warn_ignored([f"f{i}"])
        state.warn_ignored(["late"])
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "ignoring unknown request fields (told once): 'a', 'b'"
    assert len(messages) == 1 + (MAX_WARNED_FIELDS - 2) + 1  # a, b; one a name; a last word
    assert messages[-1] == f"{MAX_WARNED_FIELDS} unknown field names told; no more will be"
    assert not any("late" in m for m in messages)


def test_many_names_in_one_request_are_one_short_line(caplog: pytest.LogCaptureFixture) -> None:
    state = ServingState(AppOptions("m"))
    with caplog.at_level(logging.WARNING, logger="specctl.serve"):
        state.warn_ignored([f"n{i}" + "x" * 500 for i in range(20)])
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.endswith(f"and {20 - MAX_WARNED_NAMES} more")
    assert len(message) < 1000
