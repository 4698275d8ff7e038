"""Read tensors from a checkpoint's safetensors files (single file or sharded index)."""

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from daemon.runtime.errors import ModelLoadError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def tensor_files(path: Path) -> dict[str, Path]:
    """Map each tensor name of the checkpoint in `path` to the safetensors file holding it."""
    index_path = path / INDEX_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{index_path}: no readable 'weight_map': {exc}") from exc
        return {name: path / file for name, file in weight_map.items()}
    single = path / SINGLE_FILE
    if not single.is_file():
        raise ModelLoadError(f"{path}: neither {SINGLE_FILE} nor {INDEX_FILE} found")
    with _open(single) as handle:
        return dict.fromkeys(handle.keys(), single)


class TensorReader:
    """Loads named tensors on demand, keeping each file open once."""

    def __init__(self, directory: Path, files: dict[str, Path], handles: dict[Path, Any]) -> None:
        self.directory = directory
        self.files = files
        self._handles = handles

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def get(self, name: str) -> torch.Tensor:
        if name not in self.files:
            raise missing_tensor(self.directory, name)
        file = self.files[name]
        try:
            return self._handles[file].get_tensor(name)
        except Exception as exc:  # safetensors raises its own error types
            raise ModelLoadError(f"{file}: cannot read tensor '{name}': {exc}") from exc


@contextmanager
def open_checkpoint(path: Path) -> Iterator[TensorReader]:
    """A TensorReader over every safetensors file of the checkpoint in `path`."""
    files = tensor_files(path)
    with ExitStack() as stack:
        handles = {file: stack.enter_context(_open(file)) for file in set(files.values())}
        yield TensorReader(path, files, handles)


def _open(file: Path) -> Any:
    if not file.is_file():
        raise ModelLoadError(f"{file}: safetensors file not found")
    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except Exception as exc:  # safetensors raises its own error types
        raise ModelLoadError(f"{file}: cannot open safetensors file: {exc}") from exc


def missing_tensor(model_dir: Path, name: str) -> ModelLoadError:
    return ModelLoadError(f"{model_dir}: missing tensor '{name}' in the checkpoint")


@dataclass(slots=True)
class Headers:
    shapes: dict[str, tuple[int, ...]]  # each tensor the checkpoint holds, with its shape
    misplaced: dict[str, Path]  # tensors the index puts in a file that does not hold them

    def require(self, model_dir: Path, name: str) -> tuple[int, ...]:
        """The shape of tensor `name`; a ModelLoadError where the checkpoint lacks it."""
        if name in self.misplaced:
            raise ModelLoadError(
                f"{self.misplaced[name]}: no tensor '{name}', which {INDEX_FILE} puts there"
            )
        if name not in self.shapes:
            raise missing_tensor(model_dir, name)
        return self.shapes[name]


def read_headers(path: Path) -> Headers:
    """The checkpoint in `path`, from its safetensors headers alone (no tensor data is read).
    Every file is opened: one missing, truncated or not safetensors at all is a ModelLoadError
    naming it. A tensor the index misplaces is an error only where it is needed."""
    files = tensor_files(path)
    headers = Headers({}, {})
    for file in sorted(set(files.values())):
        with _open(file) as handle:
            held = set(handle.keys())
            for name in sorted(n for n, f in files.items() if f == file):
                if name in held:
                    headers.shapes[name] = tuple(handle.get_slice(name).get_shape())
                else:
                    headers.misplaced[name] = file
    return headers
