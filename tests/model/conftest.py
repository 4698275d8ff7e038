from pathlib import Path
from typing import Any

import pytest

from tests.model.helpers import TinyFactory
from tests.tiny_models import make_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> TinyFactory:
    """make_tiny_checkpoint, built once per distinct set of arguments in the session."""
    built: dict[str, Path] = {}

    def make(arch: str = "llama", **kwargs: Any) -> Path:
        key = repr((arch, sorted(kwargs.items())))
        if key not in built:
            built[key] = make_tiny_checkpoint(
                tmp_path_factory.mktemp(arch), arch, with_tokenizer=False, **kwargs
            )
        return built[key]

    return make


@pytest.fixture
def llama_dir(tiny_checkpoint: TinyFactory) -> Path:
    return tiny_checkpoint("llama")
