from pathlib import Path

import pytest

from tests.engine.helpers import make_engine, random_prompts, run_greedy
from tests.remote.helpers import perturbed_copy
from tests.tiny_models import make_tiny_checkpoint

VOCAB = 320
MAX_TOKENS = 24
PROMPT_LENGTHS = [3, 17, 40, 8, 25, 1, 33, 12]


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("target"), vocab_size=VOCAB, seed=0)


@pytest.fixture(scope="session")
def draft_dir(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target with a little noise: accepted about half the time, so every verdict kind
    (early rejections, all accepted) occurs."""
    return perturbed_copy(target_dir, tmp_path_factory.mktemp("draft"), noise=0.003)


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    return random_prompts(8, VOCAB, PROMPT_LENGTHS)


@pytest.fixture(scope="session")
def reference(target_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    """Target-only greedy decoding (itself checked against transformers in tests/engine)."""
    return [o.token_ids for o in run_greedy(make_engine(target_dir, batch=8), prompts, MAX_TOKENS)]
