from pathlib import Path

import pytest

from tests.engine.helpers import hf_greedy, random_prompts
from tests.remote.helpers import perturbed_copy
from tests.tiny_models import make_tiny_checkpoint

VOCAB = 320
MAX_TOKENS = 24
PROMPT_LENGTHS = [3, 17, 40, 8, 25, 1, 33, 12]


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("target"), vocab_size=VOCAB, seed=0)


@pytest.fixture(scope="session")
def draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Unrelated random weights: almost nothing it drafts is accepted."""
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("draft"),
        vocab_size=VOCAB,
        seed=1,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
    )


@pytest.fixture(scope="session")
def close_draft_dir(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target's weights slightly perturbed: most of its drafts are accepted, not all."""
    return perturbed_copy(target_dir, tmp_path_factory.mktemp("close-draft"), noise=0.003)


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    return random_prompts(16, VOCAB, PROMPT_LENGTHS)


@pytest.fixture(scope="session")
def reference(target_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy continuation of each prompt."""
    return hf_greedy(target_dir, prompts, MAX_TOKENS)
