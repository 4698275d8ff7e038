"""A model directory's config.json as this node sees it, for GET /v1/model-config: the machine
running `specctl` plans from it where the model is kept on its nodes alone."""

import json
import os
import stat
from pathlib import Path
from typing import Any

MAX_CONFIG_BYTES = 4 * 2**20  # a config.json is a few KB; a multimodal one a few hundred


class ModelConfigError(Exception):
    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


def read_model_config(path: str) -> dict[str, Any]:
    """The parsed `path/config.json`; ModelConfigError (404: not here, 422: not usable)."""
    directory = Path(path)
    if not directory.is_absolute():
        raise ModelConfigError(422, f"path {path!r} is not absolute")
    if not directory.is_dir():
        if directory.exists():
            raise ModelConfigError(422, f"{path} is a file on this node, not a model directory")
        raise ModelConfigError(404, f"model directory {path} does not exist on this node")
    file = directory / "config.json"
    try:
        # non-blocking: a FIFO named config.json would hold the open, and a worker, for ever
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ModelConfigError(404, f"{file} not found on this node") from None
    except OSError as exc:
        raise ModelConfigError(422, f"{file}: cannot read it here: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ModelConfigError(422, f"{file} is not a regular file on this node")
        data = handle.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ModelConfigError(422, f"{file} is over {MAX_CONFIG_BYTES // 2**20} MiB")
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelConfigError(422, f"{file}: not JSON here: {exc}") from None
    if not isinstance(raw, dict):
        raise ModelConfigError(422, f"{file}: not a JSON object")
    return raw
