"""The Models screen's catalog: model directories (a Hugging Face `config.json`) found at the
cluster file's model paths, next to them, and under the search directories the user named;
each with architecture, parameter count, size on disk and vocabulary, and the pairs that can
serve as drafter and verifier (same vocabulary, same tokenizer where both ship one).

Only config.json and tokenizer.json are read; weights are sized, never opened. A model of the
cluster file kept on its nodes alone (nothing at its path here: the operator's laptop, the
models on the Spark) is read through the specd of a node that loads it, as the planner reads
it (specctl/config/shapes.py): its config.json only, so neither its size nor its tokenizer is
known here.
"""

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from specctl.config.cluster import ClusterConfig
from specctl.config.model_shape import ModelShapeError, read_model_shape
from specctl.config.node_model_config import FETCH_TIMEOUT_S
from specctl.config.shapes import shape_from_nodes

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
MAX_SCAN_DEPTH = 2  # a search directory, its children and grandchildren
MAX_DIRS_SCANNED = 2000  # a bound on a search directory that is a whole disk


@dataclass(frozen=True, slots=True)
class ModelEntry:
    path: Path  # the model directory, resolved
    config_name: str | None  # its name in the cluster file's [[models]], when it is there
    architecture: str | None
    num_params: int | None
    size_on_disk_bytes: int  # weights files (0: config only, e.g. for planning)
    vocab_size: int | None
    num_layers: int | None
    tokenizer_id: str | None  # a digest of the vocabulary in tokenizer.json; None: none shipped
    problem: str | None = None  # why config.json could not be read
    on_node: str | None = None  # not on this machine: read through this node's specd

    @property
    def label(self) -> str:
        return self.config_name or self.path.name

    @property
    def has_weights(self) -> bool:
        return self.size_on_disk_bytes > 0


@dataclass(frozen=True, slots=True)
class ModelPair:
    drafter: ModelEntry
    verifier: ModelEntry
    is_tokenizer_checked: bool  # both ship tokenizer.json (and they match)


def search_roots(model_paths: Iterable[Path], extra_dirs: Iterable[Path]) -> list[Path]:
    """Where to look: each configured model directory's parent (its siblings are candidates),
    then the extra search directories; each once, in that order."""
    roots: list[Path] = []
    for path in [*(p.parent for p in model_paths), *extra_dirs]:
        resolved = path.expanduser().resolve()
        if resolved not in roots:
            roots.append(resolved)
    return roots


def find_model_dirs(roots: Iterable[Path], configured: Iterable[Path]) -> list[Path]:
    """Directories holding a config.json: the configured ones first, then what the roots
    hold within MAX_SCAN_DEPTH levels (hidden directories skipped)."""
    found: list[Path] = list(dict.fromkeys(p.resolve() for p in configured))  # each once
    num_scanned = 0
    for root in roots:
        frontier = [(root, 0)]
        while frontier and num_scanned < MAX_DIRS_SCANNED:
            directory, depth = frontier.pop(0)
            num_scanned += 1
            if (directory / "config.json").is_file() and directory not in found:
                found.append(directory)
            if depth < MAX_SCAN_DEPTH:
                frontier.extend((child, depth + 1) for child in _subdirs(directory))
    return found


def _subdirs(directory: Path) -> list[Path]:
    try:
        children = sorted(directory.iterdir())
    except OSError:
        return []
    return [c for c in children if c.is_dir() and not c.name.startswith(".")]


def weights_size_bytes(directory: Path) -> int:
    total = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        if entry.name.endswith(WEIGHT_SUFFIXES) and entry.is_file():
            total += entry.stat().st_size
    return total


def tokenizer_id(directory: Path) -> str | None:
    """A digest of tokenizer.json's vocabulary (token -> id); None when there is none or it
    cannot be read. Two models with the same digest tokenize alike."""
    path = directory / "tokenizer.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    vocab = raw.get("model", {}).get("vocab") if isinstance(raw, dict) else None
    payload = json.dumps(vocab if vocab is not None else raw, sort_keys=True).encode()
    return hashlib.sha256(payload).hexdigest()[:16]


def read_entry(directory: Path, config_name: str | None) -> ModelEntry:
    try:
        shape = read_model_shape(directory)
    except ModelShapeError as error:
        return ModelEntry(directory, config_name, None, None, 0, None, None, None, str(error))
    return ModelEntry(
        path=directory,
        config_name=config_name,
        architecture=shape.architecture,
        num_params=shape.num_params,
        size_on_disk_bytes=weights_size_bytes(directory),
        vocab_size=shape.vocab_size,
        num_layers=shape.num_layers,
        tokenizer_id=tokenizer_id(directory),
    )


def read_node_entry(config: ClusterConfig, name: str, directory: Path) -> ModelEntry:
    """The cluster file's model `name`, missing at `directory` here, as a node that loads it
    describes it (or the problem: what each node said). The node is asked for the path as
    the file writes it, as the planner asks (`directory` is resolved through this machine's
    links, which the node may not have)."""
    written = config.model_dir(name)
    try:
        read_model_shape(written)
    except ModelShapeError as error:
        said_here = str(error)  # as the planner says it
    else:
        return read_entry(directory, name)  # there after all
    shape, node, problem, _ = shape_from_nodes(config, name, written, said_here, FETCH_TIMEOUT_S)
    if shape is None:
        return ModelEntry(directory, name, None, None, 0, None, None, None, problem)
    return ModelEntry(
        path=directory,
        config_name=name,
        architecture=shape.architecture,
        num_params=shape.num_params,
        size_on_disk_bytes=0,
        vocab_size=shape.vocab_size,
        num_layers=shape.num_layers,
        tokenizer_id=None,
        on_node=node,
    )


def scan_catalog(
    configured: Mapping[str, Path],
    extra_dirs: Iterable[Path],
    config: ClusterConfig | None = None,
) -> list[ModelEntry]:
    """Every model directory found; `configured` maps [[models]] names to their directories.
    With `config` (the file, valid), a configured model missing here is read through its
    nodes."""
    names_by_dir = {path.resolve(): name for name, path in configured.items()}
    roots = search_roots(configured.values(), extra_dirs)
    directories = find_model_dirs(roots, configured.values())
    on_nodes = {
        d: name
        for d in directories
        if config is not None and (name := names_by_dir.get(d)) is not None and not d.exists()
    }
    read_there: dict[Path, ModelEntry] = {}
    if config is not None and on_nodes:  # every model's nodes asked at once: one wait in all
        with ThreadPoolExecutor(len(on_nodes), thread_name_prefix="catalog") as pool:
            found = pool.map(lambda d: read_node_entry(config, on_nodes[d], d), on_nodes)
            read_there = dict(zip(on_nodes, found, strict=True))
    return [read_there.get(d) or read_entry(d, names_by_dir.get(d)) for d in directories]


def can_pair(drafter: ModelEntry, verifier: ModelEntry) -> bool:
    """The drafter proposes tokens the verifier checks: same vocabulary, the same tokenizer
    where both ship one, and a drafter no larger than the verifier."""
    if drafter.path == verifier.path or drafter.problem or verifier.problem:
        return False
    if drafter.vocab_size != verifier.vocab_size:
        return False
    tokenizers = (drafter.tokenizer_id, verifier.tokenizer_id)
    if None not in tokenizers and tokenizers[0] != tokenizers[1]:
        return False
    return (drafter.num_params or 0) <= (verifier.num_params or 0)


def find_pairs(entries: Iterable[ModelEntry]) -> list[ModelPair]:
    """Every (drafter, verifier) pair that can work together, largest verifier first."""
    items = list(entries)
    pairs = [
        ModelPair(d, v, None not in (d.tokenizer_id, v.tokenizer_id))
        for v in items
        for d in items
        if can_pair(d, v)
    ]
    return sorted(pairs, key=lambda p: (-(p.verifier.num_params or 0), p.drafter.num_params or 0))
