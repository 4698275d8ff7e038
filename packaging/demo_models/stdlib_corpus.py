"""Training corpus: the Python standard library source of the running interpreter.

Files are listed in sorted order and split into train / held-out by a hash of their
relative path, so the split is the same on every machine with the same Python version.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

# Directories that are not representative source code (tests, code tables, a data dump,
# third-party packages).
EXCLUDED_PARTS = frozenset(
    {
        "site-packages",
        "dist-packages",
        "test",
        "tests",
        "idle_test",
        "encodings",
        "pydoc_data",
        "__pycache__",
    }
)
HELD_OUT_MODULUS = 20  # 1 file in 20 (by path hash) never seen in training


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(rel_path: str) -> bool:
    digest = hashlib.sha256(rel_path.encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELD_OUT_MODULUS == 0


def list_files(root: Path | None = None) -> list[tuple[str, Path]]:
    """Sorted (relative path, absolute path) pairs of the corpus' .py files."""
    base = root or stdlib_root()
    out = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base).as_posix()
        if EXCLUDED_PARTS.intersection(rel.split("/")[:-1]):
            continue
        out.append((rel, path))
    return out


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def split_corpus(root: Path | None = None) -> tuple[list[str], list[str]]:
    """(train texts, held-out texts), both in deterministic file order."""
    train: list[str] = []
    held: list[str] = []
    for rel, path in list_files(root):
        text = read_text(path)
        if not text or not text.strip():
            continue
        (held if is_held_out(rel) else train).append(text)
    return train, held


def held_out_paths(root: Path | None = None) -> list[tuple[str, Path]]:
    return [(rel, p) for rel, p in list_files(root) if is_held_out(rel)]
