"""The line of each key in a TOML source, for error messages."""

import tomllib

from specctl.config.toml_lines import TomlLineIndex, split_key

SOURCE = '''\
# a comment with key = "value" in it
title = "x"
description = """
name = "inside a multi-line string"
[not.a.table]
"""
ports = [
  8000,
  "name = not a key",
]
server.host = "127.0.0.1"

[[nodes]]
name = "a"
labels = { gpu = "5090" }

  [[nodes.gpus]]
  memory_gib = 32

  [[nodes.gpus]]
  memory_gib = 24

[[nodes]]
name = "b"

[[nodes.gpus]]
memory_gib = 128

[deployment.verifier]
"quoted key" = 1
nodes = ["a", "b"]
'''


def test_the_source_is_valid_toml() -> None:
    tomllib.loads(SOURCE)


def test_keys_headers_and_arrays_of_tables() -> None:
    index = TomlLineIndex(SOURCE)
    assert index.line_of(("title",)) == 2
    assert index.line_of(("description",)) == 3
    assert index.line_of(("ports",)) == 7
    assert index.line_of(("ports", 1)) == 7  # an item: the line of its key
    assert index.line_of(("server", "host")) == 11  # dotted key
    assert index.line_of(("server",)) == 11
    assert index.line_of(("nodes", 0)) == 13
    assert index.line_of(("nodes", 0, "name")) == 14
    assert index.line_of(("nodes", 0, "labels", "gpu")) == 15  # inside an inline table
    assert index.line_of(("nodes", 0, "gpus", 0, "memory_gib")) == 18
    assert index.line_of(("nodes", 0, "gpus", 1, "memory_gib")) == 21
    assert index.line_of(("nodes", 1, "name")) == 24
    assert index.line_of(("nodes", 1, "gpus", 0, "memory_gib")) == 27  # under its own parent
    assert index.line_of(("deployment", "verifier", "quoted key")) == 30
    assert index.line_of(("deployment", "verifier", "nodes", 1)) == 31


def test_missing_keys_fall_back_to_the_nearest_ancestor() -> None:
    index = TomlLineIndex(SOURCE)
    assert index.line_of(("deployment", "verifier", "model")) == 29  # its table's header
    assert index.line_of(("nodes", 1, "specd")) == 23
    assert index.line_of(("not",)) is None  # inside the multi-line string: not a table
    assert index.line_of(("name",)) is None
    assert index.line_of(("server", "port")) == 11


def test_split_key() -> None:
    assert split_key("a . \"b.c\" . 'd'") == ("a", "b.c", "d")
    assert split_key('"p\u00f6rt"') == ("p\u00f6rt",)  # UTF-8 text kept as it is
    assert split_key('"tab\\there"') == ("tab\there",)  # TOML's escapes read as TOML reads them


def _lines_after(prefix: str) -> tuple[int, int | None]:
    """(the line `port` is on, the line the index gives it) in `prefix` + a [server] table."""
    source = prefix + "\n[server]\nport = 8000\n"
    tomllib.loads(source)  # valid TOML, as the index requires
    return source.split("\n").index("port = 8000") + 1, TomlLineIndex(source).line_of(
        ("server", "port")
    )


def test_only_a_newline_ends_a_line() -> None:
    """U+2028 and U+0085 are text to TOML: in a comment or a string they moved
    every later line by one (str.splitlines() split at them), or lost them."""
    for text in ("# a \u2028 comment", "# x \x85 y", 'a = "de\x85sk"', 'a = "b\u2028c"'):
        true_line, found = _lines_after(text)
        assert found == true_line, repr(text)


def test_multi_line_strings_inside_arrays_and_quotes_at_their_ends() -> None:
    for text in (
        'names = ["""spark""", """\nsprak"""]',
        "names = ['''a''', '''\n[not.a.table]\nb''']",
        'a = """ends with two quotes"" """\nb = """\\"""\n"""',
        'a = ["x # not a comment", "]"]',
        'a = { b = "{", c = [1,\n 2] }',
    ):
        true_line, found = _lines_after(text)
        assert found == true_line, repr(text)
