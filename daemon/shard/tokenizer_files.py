"""The tokenizer of a model directory as bytes, for a serving process on another machine that
has no copy of the model: everything in the directory but the weights, within a size cap."""

from pathlib import Path

from daemon.runtime.errors import ModelLoadError

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack")
MAX_TOKENIZER_BYTES = 64 * 2**20


def read_tokenizer_files(model_dir: Path) -> dict[str, bytes]:
    """{file name: contents} of the top-level non-weight files of `model_dir`."""
    files: dict[str, bytes] = {}
    total_bytes = 0
    for path in sorted(model_dir.iterdir()):
        if not path.is_file() or path.name.endswith(WEIGHT_SUFFIXES):
            continue
        total_bytes += path.stat().st_size
        if total_bytes > MAX_TOKENIZER_BYTES:
            raise ModelLoadError(
                f"{model_dir}: non-weight files exceed {MAX_TOKENIZER_BYTES // 2**20} MiB; "
                "is this a model directory?"
            )
        files[path.name] = path.read_bytes()
    if "config.json" not in files:
        raise ModelLoadError(f"{model_dir}: no config.json in the model directory")
    return files


def write_tokenizer_files(files: dict[str, bytes], directory: Path) -> Path:
    """Write files from `read_tokenizer_files` into `directory` (names checked) and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        if "/" in name or name in {"", ".", ".."}:
            raise ModelLoadError(f"refusing tokenizer file name {name!r}")
        (directory / name).write_bytes(data)
    return directory
