"""Where each key of a TOML document is: `("nodes", 1, "specd")` -> line 9.

tomllib gives no positions, so the source is scanned once: table headers (`[a.b]`, and
`[[nodes]]` arrays of tables counted by occurrence, nested ones under their latest parent),
`key = value` lines and dotted keys, skipping the inside of multi-line strings and arrays.
A path with no line of its own (a missing field, an item of an inline array) gets the line of
its nearest ancestor that has one. The source must be valid TOML (tomllib parsed it first).
"""

import re
import tomllib

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
        if part[0] == '"':  # a basic string: its escapes as TOML reads them
            part = tomllib.loads(f"k = {part}")["k"]
        elif part[0] == "'":
            part = part[1:-1]
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
        value = _ValueScan()  # a value that goes on over the next lines
        # TOML ends lines at "\n" alone (str.splitlines() also split at U+2028, U+0085 and
        # form feeds, inside comments and strings too, and numbered every line after one wrong)
        for number, line in enumerate(source.split("\n"), start=1):
            if value.is_open:
                value.feed(line)
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
                value.feed(pair.group(2))

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


class _ValueScan:
    """How far a value's text has got, line by line: the brackets it holds open and the
    string it is inside, if any. A multi-line string or array goes on over the next lines;
    keys and headers there are text, not keys."""

    def __init__(self) -> None:
        self.depth = 0  # open [ and { outside strings
        self.string: str | None = None  # the delimiter of the string being read

    @property
    def is_open(self) -> bool:
        return self.depth > 0 or self.string is not None

    def feed(self, text: str) -> None:
        i = 0
        while i < len(text):
            delimiter = self.string
            if delimiter is None:
                char = text[i]
                if char == "#":
                    break  # a comment, to the end of the line
                if text.startswith(('"""', "'''"), i):
                    self.string, i = text[i : i + 3], i + 3
                    continue
                if char in "\"'":
                    self.string = char
                elif char in "[{":
                    self.depth += 1
                elif char in "]}":
                    self.depth -= 1
                i += 1
            elif text[i] == "\\" and delimiter[0] == '"':
                i += 2  # an escape (or a line-ending backslash) in a basic string
            elif text.startswith(delimiter, i):
                i += len(delimiter)
                if len(delimiter) == 3:  # up to two quotes of the content may end it too
                    extra = 0
                    while extra < 2 and i < len(text) and text[i] == delimiter[0]:
                        i, extra = i + 1, extra + 1
                self.string = None
            else:
                i += 1
        if self.string in ('"', "'"):  # a one-line string ends with its line (valid TOML)
            self.string = None
