"""Where each key of a TOML document is: `("nodes", 1, "specd")` -> line 9.

tomllib gives no positions, so the source is scanned once: table headers (`[a.b]`, and
`[[nodes]]` arrays of tables counted by occurrence, nested ones under their latest parent),
`key = value` lines and dotted keys, skipping the inside of multi-line strings and arrays.
A path with no line of its own (a missing field, an item of an inline array) gets the line of
its nearest ancestor that has one. The source must be valid TOML (tomllib parsed it first).
"""

import re

from specctl.config.errors import Loc

_BARE_KEY = r"[A-Za-z0-9_-]+"
_QUOTED_KEY = r'"(?:[^"\\]|\\.)*"|\'[^\']*\''
_KEY_PART = rf"(?:{_BARE_KEY}|{_QUOTED_KEY})"
_DOTTED_KEY = rf"{_KEY_PART}(?:\s*\.\s*{_KEY_PART})*"
_ARRAY_HEADER = re.compile(rf"^\s*\[\[\s*({_DOTTED_KEY})\s*\]\]")
_TABLE_HEADER = re.compile(rf"^\s*\[\s*({_DOTTED_KEY})\s*\]")
_KEY_VALUE = re.compile(rf"^\s*({_DOTTED_KEY})\s*=(.*)$")
_PART = re.compile(_KEY_PART)


def split_key(dotted: str) -> tuple[str, ...]:
    parts = []
    for match in _PART.finditer(dotted):
        part = match.group(0)
        if part[0] in "\"'":
            part = part[1:-1].encode().decode("unicode_escape") if part[0] == '"' else part[1:-1]
        parts.append(part)
    return tuple(parts)


class TomlLineIndex:
    def __init__(self, source: str) -> None:
        self._lines: dict[Loc, int] = {}
        self._array_sizes: dict[Loc, int] = {}  # array-of-tables path -> tables seen so far
        self._scan(source)

    def line_of(self, loc: Loc) -> int | None:
        """The line of `loc`, or of its nearest ancestor that has a line; None if none has."""
        for end in range(len(loc), 0, -1):
            line = self._lines.get(tuple(loc[:end]))
            if line is not None:
                return line
        return None

    def _scan(self, source: str) -> None:
        table: Loc = ()
        skip_until: str | None = None  # the closing text of a multi-line value being skipped
        depth = 0  # open brackets of a multi-line array value
        for number, line in enumerate(source.splitlines(), start=1):
            if skip_until is not None:
                if skip_until in line:
                    skip_until = None
                continue
            if depth > 0:
                depth += _bracket_balance(line)
                continue
            if header := _ARRAY_HEADER.match(line):
                table = self._open_array_table(split_key(header.group(1)), number)
            elif header := _TABLE_HEADER.match(line):
                table = self._resolve(split_key(header.group(1)))
                self._lines.setdefault(table, number)
            elif pair := _KEY_VALUE.match(line):
                key = split_key(pair.group(1))
                for end in range(1, len(key) + 1):
                    self._lines.setdefault(table + key[:end], number)
                skip_until = _open_multiline_string(pair.group(2))
                depth = _bracket_balance(pair.group(2)) if skip_until is None else 0

    def _resolve(self, key: tuple[str, ...]) -> Loc:
        """A header's key with the latest index inserted after every array of tables in it."""
        path: Loc = ()
        for part in key:
            path = (*path, part)
            size = self._array_sizes.get(path)
            if size:
                path = (*path, size - 1)
        return path

    def _open_array_table(self, key: tuple[str, ...], number: int) -> Loc:
        parent = self._resolve(key[:-1])
        array = (*parent, key[-1])
        index = self._array_sizes.get(array, 0)
        self._array_sizes[array] = index + 1
        self._lines.setdefault(array, number)
        table = (*array, index)
        self._lines[table] = number
        return table


def _open_multiline_string(value: str) -> str | None:
    """The delimiter that closes a multi-line string opened (and not closed) in `value`."""
    stripped = value.strip()
    for delimiter in ('"""', "'''"):
        if stripped.startswith(delimiter) and stripped.count(delimiter) == 1:
            return delimiter
    return None


def _bracket_balance(text: str) -> int:
    """Opened minus closed brackets outside strings and comments."""
    balance = 0
    quote: str | None = None
    escaped = False
    for char in text:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\" and quote == '"':
                escaped = True
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char == "#":
            break
        elif char in "[{":
            balance += 1
        elif char in "]}":
            balance -= 1
    return balance
