"""Load cluster.toml: TOML syntax, the schema, references across sections, the models' shapes.

Every stage reports all the problems it finds, each as `file:line: field: what is wrong and
what would be valid`; a later stage runs only when the earlier ones found nothing, so one
mistake gives one error, not a cascade.
"""

import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from specctl.config.cluster import ClusterConfig
from specctl.config.errors import ConfigError, ConfigIssue, Loc
from specctl.config.node_model_config import FETCH_TIMEOUT_S
from specctl.config.pydantic_messages import describe
from specctl.config.references import Problem, check_references
from specctl.config.shapes import check_shapes, read_shapes
from specctl.config.toml_lines import TomlLineIndex

_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")
_TOML_END = re.compile(r"\s*\(at end of document\)$")


def load_config(path: Path | str, nodes_timeout_s: float | None = FETCH_TIMEOUT_S) -> ClusterConfig:
    """Read and check the cluster file at `path`; raise ConfigError listing what is wrong.
    A model kept on its nodes alone is read through their specds, answers awaited
    `nodes_timeout_s` (None: no node is asked, and such a model is an error)."""
    text = read_config_text(path)
    return load_config_text(text, Path(path), str(path), nodes_timeout_s)


def read_config_text(path: Path | str) -> str:
    """The cluster file's text, as load_config reads it; ConfigError where it cannot be read."""
    file_path = Path(path)
    shown = str(path)
    try:
        return file_path.read_text(encoding="utf-8-sig")  # a byte-order mark (editors on
        # Windows write one) is not TOML, and tomllib called it an invalid statement
    except FileNotFoundError:
        raise ConfigError([ConfigIssue(shown, None, (), "file not found")]) from None
    except IsADirectoryError:
        raise ConfigError([ConfigIssue(shown, None, (), "is a directory, not a file")]) from None
    except UnicodeDecodeError as error:
        issue = ConfigIssue(shown, None, (), f"not UTF-8 text (byte {error.start})")
        raise ConfigError([issue]) from None
    except OSError as error:
        issue = ConfigIssue(shown, None, (), f"cannot read it: {error.strerror}")
        raise ConfigError([issue]) from None


def load_config_text(
    text: str,
    source_path: Path | None = None,
    shown_name: str | None = None,
    nodes_timeout_s: float | None = FETCH_TIMEOUT_S,
    read_models: bool = True,
) -> ClusterConfig:
    """Check cluster.toml text (the TUI's edited buffer). Relative paths start at
    `source_path`'s directory (else the cwd); errors name `shown_name` (else the path).
    `read_models` False: no model's config.json is read (nor checked), for what needs the
    nodes alone: a model missing, or kept on nodes that are down, does not hide them."""
    shown = shown_name or (str(source_path) if source_path else "cluster.toml")
    data = _parse_toml(text, shown)
    lines = TomlLineIndex(text)

    def fail(problems: list[Problem], unreachable: frozenset[Loc] = frozenset()) -> ConfigError:
        issues = [
            ConfigIssue(shown, lines.line_of(loc), loc, message, unreachable=loc in unreachable)
            for loc, message in problems
        ]
        return ConfigError(issues)

    try:
        config = ClusterConfig.model_validate(data)
    except ValidationError as error:
        problems = [(_loc(item["loc"]), describe(ClusterConfig, item)) for item in error.errors()]
        raise fail(problems) from None
    config.attach(source_path, {})
    if problems := check_references(config):
        raise fail(problems)
    if not read_models:
        return config
    shapes, problems, unreachable = read_shapes(config, nodes_timeout_s)
    if problems:
        raise fail(problems, frozenset(unreachable))
    if problems := check_shapes(config, shapes):
        raise fail(problems)
    config.attach(source_path, shapes)
    return config


def _loc(raw: tuple[Any, ...]) -> Loc:
    return tuple(part if isinstance(part, int) else str(part) for part in raw)


def _parse_toml(text: str, shown: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        message = str(error)
        line: int | None = None
        if match := _TOML_POSITION.search(message):
            line = int(match.group(1))
            message = f"{message[: match.start()]} (column {match.group(2)})"
        elif _TOML_END.search(message):
            line = max(1, text.count("\n") + (0 if text.endswith("\n") else 1))
            message = _TOML_END.sub(" (at the end of the file)", message)
        issue = ConfigIssue(shown, line, (), f"invalid TOML: {message}")
        raise ConfigError([issue]) from None
    except RecursionError:  # tomllib's parser recurses per level of nested arrays and tables
        line = next(
            (
                n
                for n, row in enumerate(text.split("\n"), 1)
                if row.count("[") + row.count("{") > 64
            ),
            None,
        )
        issue = ConfigIssue(shown, line, (), "invalid TOML: values nested too deeply to read")
        raise ConfigError([issue]) from None
