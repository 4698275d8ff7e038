"""The cluster file being edited: its document (comments and order kept), whether it has
unsaved changes, its check (valid config, or the issues naming line and field), and Save.

The UI thread edits; workers check snapshots of the text and save. A lock keeps the two
from touching the document at once. Saving the embedded default writes ./cluster.toml
instead of the shipped example; relative paths in it (model directories, token and API key
files) are rewritten to point at the same places from the new file's directory.
"""

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from specctl.config.cluster import ClusterConfig
from specctl.config.document import ConfigDocument
from specctl.config.errors import ConfigError, ConfigIssue, Loc
from specctl.config.loader import load_config_text

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ConfigCheck:
    config: ClusterConfig | None  # None when the file is not valid
    issues: tuple[ConfigIssue, ...] = ()

    @property
    def is_valid(self) -> bool:
        return self.config is not None


@dataclass(frozen=True, slots=True)
class ConfigSnapshot:
    """The document's text at one revision, for a worker to check without the document."""

    text: str
    path: Path
    revision: int

    def check(self, read_models: bool = True) -> ConfigCheck:
        """The whole file checked; `read_models` False: all but its models' config.json (what
        the Nodes and Logs screens need: the nodes, even where a model is missing, or kept on
        nodes that are down)."""
        try:
            return ConfigCheck(
                load_config_text(self.text, self.path, str(self.path), read_models=read_models)
            )
        except ConfigError as error:
            return ConfigCheck(None, tuple(error.issues))


@dataclass(slots=True)
class ConfigSession:
    document: ConfigDocument
    save_path: Path  # where Save writes
    saved_text: str = ""  # the text as last loaded or saved
    revision: int = 0  # bumped on every edit: a late check can be told from a fresh one
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def open(cls, path: Path, save_path: Path | None = None) -> "ConfigSession":
        """Load `path` (ConfigError when it cannot be read or is not TOML)."""
        document = ConfigDocument.load(path.resolve())
        return cls(document, (save_path or path).resolve(), document.text())

    @property
    def path(self) -> Path:
        """The file the document came from (or was last saved to)."""
        assert self.document.path is not None
        return self.document.path

    @property
    def is_dirty(self) -> bool:
        with self.lock:
            return self.document.text() != self.saved_text or self.path != self.save_path

    def edit(self, change: Callable[[ConfigDocument], T]) -> T:
        """Run `change` on the document; a change that raises leaves the revision as it was."""
        with self.lock:
            result = change(self.document)
            self.revision += 1
            return result

    def snapshot(self) -> ConfigSnapshot:
        with self.lock:
            return ConfigSnapshot(self.document.text(), self.path, self.revision)

    def save(self) -> Path:
        return self.save_checked()[0]

    def save_checked(self) -> tuple[Path, str | None]:
        """Validate and write to `save_path` (ConfigError, nothing written, when invalid;
        OSError when the file cannot be written, the document then as it was). Where all
        that fails is a model kept on nodes that do not answer, it is saved all the same:
        nodes down do not make the file wrong. Returns the path, and what could not be
        checked (None: all of it)."""
        # checked outside the lock the UI's edits take: a model kept on its nodes alone is read
        # through their specds, and the UI froze while a node was slow to answer
        snapshot = self.snapshot()
        unchecked = _unchecked(
            lambda: load_config_text(snapshot.text, snapshot.path, str(snapshot.path))
        )
        with self.lock:
            if self.revision != snapshot.revision:  # edited meanwhile: checked again
                unchecked = _unchecked(self.document.validate)
            old_dir, new_dir = self.path.parent, self.save_path.parent
            rebase_relative_paths(self.document, old_dir, new_dir)
            try:
                self.document.save(self.save_path, validate=False)
            except BaseException:
                rebase_relative_paths(self.document, new_dir, old_dir)
                raise
            self.saved_text = self.document.text()
            return self.save_path, unchecked


def _unchecked(check: Callable[[], object]) -> str | None:
    """What `check` could not check because a model's nodes did not answer (None: it all
    passed); ConfigError where the file is wrong."""
    try:
        check()
    except ConfigError as error:
        if not error.unreachable:
            raise
        return str(error)
    return None


def _path_fields(document: ConfigDocument) -> list[Loc]:
    fields: list[Loc] = [("server", "api_key_file")]
    for section, key in (("models", "path"), ("nodes", "token_file")):
        entries = document.get((section,)) or []
        fields += [(section, index, key) for index in range(len(entries))]
    return fields


def rebase_relative_paths(document: ConfigDocument, old_dir: Path, new_dir: Path) -> list[Loc]:
    """Rewrite relative paths written for `old_dir` so they hold from `new_dir`; returns the
    fields changed."""
    changed: list[Loc] = []
    if old_dir.resolve() == new_dir.resolve():
        return changed
    for loc in _path_fields(document):
        raw = document.get(loc)
        if not isinstance(raw, str) or raw.startswith("~") or Path(raw).is_absolute():
            continue
        target = os.path.normpath(os.path.join(old_dir.absolute(), raw))  # links kept as written
        rebased = os.path.relpath(target, new_dir.absolute())
        if rebased != raw:
            document.set(loc, rebased)
            changed.append(loc)
    return changed


def configured_model_dirs(document: ConfigDocument) -> dict[str, Path]:
    """[[models]] names and their directories as written, valid file or not."""
    base = document.path.parent if document.path else Path.cwd()
    found: dict[str, Path] = {}
    for entry in document.get(("models",)) or []:
        name, raw = entry.get("name"), entry.get("path")
        if isinstance(name, str) and isinstance(raw, str):
            found[name] = (base / Path(raw).expanduser()).resolve()
    return found
