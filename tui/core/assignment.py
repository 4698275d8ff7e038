"""The Assign screen's fields, read from and written to the cluster document.

Each edit changes the fewest lines it can (a field left out stays out while it holds its
default), so the user's comments and order survive. What the user types is parsed here
(`FieldInputError` says what a field wants); ranges and cross-references are the schema's
job: the verdict shows its issues, each naming line and field.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specctl.config.document import ConfigDocument
from specctl.config.errors import Loc
from specctl.config.schema import DEFAULT_ADAPTIVE_MAX_K, DEFAULT_K, DEFAULT_PORT, NGRAM

VERIFIER: Loc = ("deployment", "verifier")
DRAFTER: Loc = ("deployment", "drafter")
SPECULATION: Loc = ("deployment", "speculation")
REPLICAS: Loc = ("deployment", "replicas")
PORT: Loc = ("server", "port")
MODES = ("overlapped", "sync")


class FieldInputError(ValueError):
    """What the user typed cannot be that field's value; str() says what it wants."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """The form's values as the document holds them (the schema's defaults where absent)."""

    model_names: tuple[str, ...]
    node_names: tuple[str, ...]
    verifier_model: str | None
    verifier_nodes: tuple[str, ...]
    tensor_parallel_size: str
    pipeline_split: str  # "auto" or "64, 16"
    drafter_model: str | None  # a model name or "ngram"
    drafter_node: str | None
    k: str
    is_adaptive: bool
    max_k: str
    mode: str
    replicas: str
    port: str


def _names(document: ConfigDocument, section: str) -> tuple[str, ...]:
    entries = document.get((section,)) or []
    return tuple(str(e.get("name")) for e in entries if isinstance(e, dict) and e.get("name"))


def _text(value: Any, default: object) -> str:
    return str(default if value is None else value)


def _split_text(split: Any) -> str:
    return ", ".join(map(str, split)) if isinstance(split, list) else _text(split, "auto")


def read_assignment(document: ConfigDocument) -> Assignment:
    get = document.get
    split = get((*VERIFIER, "pipeline_split"))
    nodes = get((*VERIFIER, "nodes"))
    return Assignment(
        model_names=_names(document, "models"),
        node_names=_names(document, "nodes"),
        verifier_model=get((*VERIFIER, "model")),
        verifier_nodes=tuple(str(n) for n in nodes) if isinstance(nodes, list) else (),
        tensor_parallel_size=_text(get((*VERIFIER, "tensor_parallel_size")), 1),
        pipeline_split=_split_text(split),
        drafter_model=get((*DRAFTER, "model")),
        drafter_node=get((*DRAFTER, "node")),
        k=_text(get((*SPECULATION, "k")), DEFAULT_K),
        is_adaptive=bool(get((*SPECULATION, "adaptive"))),
        max_k=_text(get((*SPECULATION, "max_k")), DEFAULT_ADAPTIVE_MAX_K),
        mode=_text(get((*SPECULATION, "mode")), "overlapped"),
        replicas=_text(get(REPLICAS), 1),
        port=_text(get(PORT), DEFAULT_PORT),
    )


def _put(document: ConfigDocument, loc: Loc, value: Any, default: Any = None) -> bool:
    """Set `loc` to `value` unless it is absent and `value` is its default; True if changed."""
    current = document.get(loc)
    if current == value or (current is None and value == default):
        return False
    document.set(loc, value)
    return True


def parse_whole_number(text: str, what: str) -> int:
    cleaned = text.strip()
    if not re.fullmatch(r"[+-]?\d+", cleaned):
        raise FieldInputError(f"{what}: a whole number, e.g. 4; got {text!r}")
    return int(cleaned)


def parse_pipeline_split(text: str) -> str | list[int]:
    cleaned = text.strip().strip("[]").strip()
    if cleaned.lower() in ("", "auto"):
        return "auto"
    parts = [p for p in re.split(r"[,\s]+", cleaned) if p]
    if not all(re.fullmatch(r"\d+", p) for p in parts):
        raise FieldInputError(f'pipeline split: "auto" or layer counts, e.g. 64, 16; got {text!r}')
    return [int(p) for p in parts]


def set_verifier_model(document: ConfigDocument, name: str) -> bool:
    return _put(document, (*VERIFIER, "model"), name)


def set_verifier_nodes(document: ConfigDocument, names: list[str]) -> bool:
    if not names:
        raise FieldInputError("verifier nodes: pick at least one (one per pipeline stage)")
    return _put(document, (*VERIFIER, "nodes"), list(names))


def set_tensor_parallel_size(document: ConfigDocument, text: str) -> bool:
    size = parse_whole_number(text, "tensor-parallel size")
    return _put(document, (*VERIFIER, "tensor_parallel_size"), size, 1)


def set_pipeline_split(document: ConfigDocument, text: str) -> bool:
    return _put(document, (*VERIFIER, "pipeline_split"), parse_pipeline_split(text), "auto")


def set_drafter_model(document: ConfigDocument, name: str) -> bool:
    """A model, or "ngram" (which takes no node). A model without a node gets the first node
    that is not a verifier node (or the first node)."""
    changed = _put(document, (*DRAFTER, "model"), name)
    if name == NGRAM:
        changed |= document.get((*DRAFTER, "node")) is not None
        document.remove((*DRAFTER, "node"))
        return changed
    if document.get((*DRAFTER, "node")) is None:
        nodes = _names(document, "nodes")
        verifier_nodes = document.get((*VERIFIER, "nodes")) or []
        spare = [n for n in nodes if n not in verifier_nodes] or list(nodes)
        if spare:
            document.set((*DRAFTER, "node"), spare[0])
            changed = True
    return changed


def set_drafter_node(document: ConfigDocument, name: str) -> bool:
    if document.get((*DRAFTER, "model")) == NGRAM:
        raise FieldInputError("drafter node: the n-gram drafter runs inside the verifier")
    return _put(document, (*DRAFTER, "node"), name)


def set_k(document: ConfigDocument, text: str) -> bool:
    return _put(document, (*SPECULATION, "k"), parse_whole_number(text, "k"), DEFAULT_K)


def set_max_k(document: ConfigDocument, text: str) -> bool:
    value = parse_whole_number(text, "max k")
    return _put(document, (*SPECULATION, "max_k"), value, DEFAULT_ADAPTIVE_MAX_K)


def set_adaptive(document: ConfigDocument, is_adaptive: bool) -> bool:
    """Adaptive takes max_k (the old k as its ceiling); fixed takes k (the old ceiling)."""
    get = document.get
    if bool(get((*SPECULATION, "adaptive"))) == is_adaptive:
        return False
    if is_adaptive:
        ceiling = get((*SPECULATION, "k"))
        document.remove((*SPECULATION, "k"))
        document.set((*SPECULATION, "adaptive"), True)
        if ceiling:
            document.set((*SPECULATION, "max_k"), ceiling)
    else:
        ceiling = get((*SPECULATION, "max_k"))
        document.remove((*SPECULATION, "adaptive"))
        document.remove((*SPECULATION, "max_k"))
        document.set((*SPECULATION, "k"), ceiling if ceiling is not None else DEFAULT_K)
    return True


def set_mode(document: ConfigDocument, mode: str) -> bool:
    if mode not in MODES:
        raise FieldInputError(f"mode: one of {', '.join(MODES)}; got {mode!r}")
    return _put(document, (*SPECULATION, "mode"), mode, "overlapped")


def set_replicas(document: ConfigDocument, text: str) -> bool:
    return _put(document, REPLICAS, parse_whole_number(text, "replicas"), 1)


def set_port(document: ConfigDocument, text: str) -> bool:
    return _put(document, PORT, parse_whole_number(text, "port"), DEFAULT_PORT)


def model_name_for(path: Path, taken: tuple[str, ...]) -> str:
    """A [[models]] name for a directory: its name made valid, made unique."""
    base = re.sub(r"[^A-Za-z0-9_.-]", "-", path.name).strip("-_.")[:60] or "model"
    name, number = base, 2
    while name in taken or name == NGRAM:
        name, number = f"{base}-{number}", number + 1
    return name


def add_model(document: ConfigDocument, directory: Path) -> str:
    """The [[models]] name of `directory`, adding a table for it when the file has none."""
    config_dir = (document.path.parent if document.path else Path.cwd()).resolve()
    for entry in document.get(("models",)) or []:
        raw, name = entry.get("path"), entry.get("name")
        if not isinstance(raw, str) or not name:
            continue
        if (config_dir / Path(raw).expanduser()).resolve() == directory:
            return str(name)
    name = model_name_for(directory, _names(document, "models"))
    relative = os.path.relpath(directory, config_dir)
    shown = relative if not relative.startswith("../../..") else str(directory)
    document.append_table("models", {"name": name, "path": shown})
    return name
