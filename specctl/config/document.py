"""Editing cluster.toml in place: change a field, keep everything else byte for byte.

The TUI loads the user's file, sets the fields the user changes, shows the planner's verdict on
the edited text (`validate()`), and saves. tomlkit keeps comments, key order and formatting, so
changing one field changes one line.

    doc = ConfigDocument.load("cluster.toml")
    doc.set(("deployment", "drafter", "node"), "spark")
    config = doc.validate()          # ConfigError naming the line, as for load_config
    doc.save()                       # atomic; the file keeps its mode
"""

import os
import tempfile
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.container import Container
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import AoT, Table
from tomlkit.toml_document import TOMLDocument

from specctl.config.cluster import ClusterConfig
from specctl.config.errors import ConfigError, ConfigIssue, Loc, field_name
from specctl.config.loader import load_config_text


class ConfigDocument:
    def __init__(self, document: TOMLDocument, path: Path | None) -> None:
        """Use ConfigDocument.load() or ConfigDocument.from_text()."""
        self._document = document
        self.path = path

    @classmethod
    def load(cls, path: Path | str) -> "ConfigDocument":
        file_path = Path(path)
        try:
            text = file_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            issue = ConfigIssue(str(path), None, (), f"cannot read it: {error}")
            raise ConfigError([issue]) from None
        return cls.from_text(text, file_path)

    @classmethod
    def from_text(cls, text: str, path: Path | None = None) -> "ConfigDocument":
        try:
            document = tomlkit.parse(text)
        except TOMLKitError as error:
            load_config_text(text, path)  # raises the same one-line TOML error as a load
            shown = str(path) if path else "cluster.toml"  # tomlkit stricter than tomllib
            raise ConfigError([ConfigIssue(shown, None, (), f"invalid TOML: {error}")]) from None
        return cls(document, path)

    def text(self) -> str:
        return self._document.as_string()

    def get(self, loc: Loc) -> Any:
        """The plain value at `loc`, or None when it is absent."""
        node: Any = self._document
        for part in loc:
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                return None
        return node.unwrap() if hasattr(node, "unwrap") else node

    def set(self, loc: Loc, value: Any) -> None:
        """Set the field at `loc`, creating missing tables on the way; None removes it."""
        if not loc or not isinstance(loc[-1], str):
            raise ValueError(f"cannot set {field_name(loc) or 'the whole file'}: not a field")
        if value is None:
            self.remove(loc)
            return
        parent = self._container(loc[:-1], create=True)
        parent[loc[-1]] = value

    def remove(self, loc: Loc) -> None:
        """Remove the field, table, or [[array]] entry at `loc` (absent: nothing to do)."""
        try:
            parent = self._container(loc[:-1], create=False)
        except KeyError:
            return
        key = loc[-1]
        is_entry = isinstance(parent, AoT) and isinstance(key, int) and key < len(parent)
        if is_entry or (isinstance(key, str) and key in parent):
            del parent[key]

    def append_table(self, array: str, values: dict[str, Any]) -> int:
        """Add a `[[array]]` table (a node, a model) at the end of its kind; returns its index."""
        table = tomlkit.table()
        for key, value in values.items():
            table[key] = value
        if array not in self._document:
            self._document[array] = tomlkit.aot()
        entries = self._document[array]
        if not isinstance(entries, AoT):
            raise ValueError(f"{array} is not an array of tables ([[{array}]])")
        entries.append(table)
        return len(entries) - 1

    def validate(self) -> ClusterConfig:
        """Check the edited text as `load_config` would check the file."""
        shown = str(self.path) if self.path else None
        return load_config_text(self.text(), self.path, shown)

    def save(self, path: Path | str | None = None, validate: bool = True) -> None:
        """Write atomically (a temporary file renamed over the old one, keeping its mode).
        With `validate` (the default) an invalid document raises ConfigError and writes
        nothing."""
        target = Path(path) if path is not None else self.path
        if target is None:
            raise ValueError("no path to save to: give one")
        if validate:
            self.validate()
        mode = target.stat().st_mode & 0o777 if target.exists() else 0o644
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                file.write(self.text())
                file.flush()
                os.fsync(file.fileno())
            os.chmod(tmp_name, mode)
            os.replace(tmp_name, target)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        self.path = target

    def _container(self, loc: Loc, create: bool) -> Any:
        node: Any = self._document
        for depth, part in enumerate(loc):
            if isinstance(part, int):
                if not isinstance(node, AoT | list) or part >= len(node):
                    raise KeyError(f"{field_name(loc[: depth + 1])}: no such entry")
                node = node[part]
                continue
            if part not in node:
                if not create:
                    raise KeyError(f"{field_name(loc[: depth + 1])}: absent")
                node[part] = tomlkit.table()
            node = node[part]
            if not isinstance(node, Table | Container | AoT | dict):
                raise ValueError(f"{field_name(loc[: depth + 1])} is a value, not a table")
        return node
