"""Scaled RoPE variants match transformers (the tables come from its ROPE_INIT_FUNCTIONS)."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from daemon.runtime.model import load_model
from daemon.runtime.model.hf_fallback import HFCausalLM
from daemon.runtime.model.llama import LlamaForCausalLM
from tests.model.helpers import TinyFactory, assert_step_matches_hf, random_tokens, step
from tests.tiny_models import make_tiny_checkpoint

ROPE_VARIANTS: dict[str, dict[str, Any]] = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    "theta": {"rope_type": "default", "rope_theta": 500.0},
}
HALF_HEAD_DIM = 8  # tiny default: hidden 64 / 4 heads / 2


def _check_long_sequences(path: Path, *, lean: bool) -> None:
    model = load_model(path)
    assert isinstance(model, LlamaForCausalLM) == lean
    generator = torch.Generator().manual_seed(1)
    sequences: dict[int, list[int]] = {}
    chunks = {0: random_tokens(generator, 40), 1: random_tokens(generator, 25)}
    logits = step(model, sequences, chunks, {0: 0, 1: 0})
    assert_step_matches_hf(path, logits, sequences, chunks)
    chunks = {0: random_tokens(generator, 3), 1: random_tokens(generator, 1)}
    logits = step(model, sequences, chunks, {0: 40, 1: 25})
    assert_step_matches_hf(path, logits, sequences, chunks)


@pytest.mark.parametrize("variant", list(ROPE_VARIANTS))
def test_rope_variant_matches_transformers(tiny_checkpoint: TinyFactory, variant: str) -> None:
    path = tiny_checkpoint("llama", rope_scaling=ROPE_VARIANTS[variant])
    _check_long_sequences(path, lean=True)


def test_scaling_changes_logits(tiny_checkpoint: TinyFactory) -> None:
    """Each variant's table really differs from plain RoPE at long positions."""
    tokens = {0: list(range(30, 70))}
    base = step(load_model(tiny_checkpoint("llama")), {}, tokens, {0: 0})
    for variant in ("linear", "llama3", "yarn"):
        scaled = step(
            load_model(tiny_checkpoint("llama", rope_scaling=ROPE_VARIANTS[variant])),
            {},
            tokens,
            {0: 0},
        )
        assert base is not None and scaled is not None
        assert (base[0, 20:] - scaled[0, 20:]).abs().max() > 1e-3, variant


def test_legacy_rope_theta_and_rope_scaling_keys(tmp_path: Path) -> None:
    """Older config.json files carry `rope_theta` + `rope_scaling` {"type": ...}."""
    path = make_tiny_checkpoint(tmp_path, "llama", with_tokenizer=False, seed=5)
    config = json.loads((path / "config.json").read_text())
    del config["rope_parameters"]
    config["rope_theta"] = 1000.0
    config["rope_scaling"] = {"type": "linear", "factor": 2.0}
    (path / "config.json").write_text(json.dumps(config))
    _check_long_sequences(path, lean=True)


def test_longrope_falls_back_to_transformers(tmp_path: Path) -> None:
    rope = {
        "rope_type": "longrope",
        "short_factor": [1.0] * HALF_HEAD_DIM,
        "long_factor": [float(i + 1) for i in range(HALF_HEAD_DIM)],
        "original_max_position_embeddings": 256,
    }
    path = make_tiny_checkpoint(tmp_path, "llama", rope_scaling=rope, with_tokenizer=False)
    assert isinstance(load_model(path), HFCausalLM)
    _check_long_sequences(path, lean=False)
