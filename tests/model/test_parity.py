"""The lean runner's logits equal transformers' own implementation of the same checkpoint."""

from pathlib import Path
from typing import Any

import pytest
import torch

from daemon.runtime.model import LogitsMode, load_model
from daemon.runtime.model.hf_fallback import HFCausalLM
from daemon.runtime.model.llama import LlamaForCausalLM
from tests.model.helpers import TinyFactory, assert_step_matches_hf, random_tokens, step

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama-mha": ("llama", {"num_kv_heads": 4}),
    "llama-mqa": ("llama", {"num_kv_heads": 1, "seed": 3}),
    "llama-bias": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "qwen2-bias": ("qwen2", {}),
    "qwen3-qk-norm": ("qwen3", {}),
    "qwen3-tied": ("qwen3", {"tie_word_embeddings": True, "seed": 1}),
    "mistral-window": ("mistral", {"sliding_window": 5}),
    "qwen2-window": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
    ),
}
PROMPT_LENGTHS = {0: 13, 1: 1, 2: 7}


def _prefill_and_decode(path: Path, **load_kwargs: Any) -> None:
    model = load_model(path, **load_kwargs)
    generator = torch.Generator().manual_seed(0)
    sequences: dict[int, list[int]] = {}
    chunks = {s: random_tokens(generator, n) for s, n in PROMPT_LENGTHS.items()}
    logits = step(model, sequences, chunks, dict.fromkeys(chunks, 0))
    assert_step_matches_hf(path, logits, sequences, chunks)
    chunks = {s: random_tokens(generator, n) for s, n in {0: 1, 1: 4, 2: 6}.items()}
    starts = {s: len(sequences[s]) for s in chunks}
    logits = step(model, sequences, chunks, starts)
    assert_step_matches_hf(path, logits, sequences, chunks)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_lean_matches_transformers(tiny_checkpoint: TinyFactory, variant: str) -> None:
    arch, kwargs = VARIANTS[variant]
    path = tiny_checkpoint(arch, **kwargs)
    assert isinstance(load_model(path), LlamaForCausalLM)
    _prefill_and_decode(path)


@pytest.mark.parametrize("variant", ["llama", "qwen3-qk-norm", "mistral-window"])
def test_hf_fallback_matches_transformers(tiny_checkpoint: TinyFactory, variant: str) -> None:
    arch, kwargs = VARIANTS[variant]
    path = tiny_checkpoint(arch, **kwargs)
    assert isinstance(load_model(path, backend="hf"), HFCausalLM)
    _prefill_and_decode(path, backend="hf")


def test_sliding_window_changes_logits(tiny_checkpoint: TinyFactory) -> None:
    """The window is really applied: same weights without it give different logits."""
    windowed = load_model(tiny_checkpoint("mistral", sliding_window=5))
    full = load_model(tiny_checkpoint("mistral", sliding_window=None))
    chunks = {0: list(range(20, 32))}
    a = step(windowed, {}, chunks, {0: 0}, LogitsMode.ALL)
    b = step(full, {}, chunks, {0: 0}, LogitsMode.ALL)
    assert a is not None and b is not None
    torch.testing.assert_close(a[0, :5], b[0, :5], atol=1e-5, rtol=0)
    assert (a[0, 6:] - b[0, 6:]).abs().max() > 1e-3


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_prompt_in_chunks_after_its_prefix_matches_transformers(
    tiny_checkpoint: TinyFactory, variant: str
) -> None:
    """A prompt prefilled in chunks of one row each, past the native kernel's 16 tokens (the
    lower-right causal attention) and short ones, beside another slot: every chunk's logits
    are transformers' for the whole sequence so far. The windowed variants (windows of 4-5
    tokens, shorter than the context) take the explicit mask."""
    arch, kwargs = VARIANTS[variant]
    path = tiny_checkpoint(arch, **kwargs)
    model = load_model(path)
    generator = torch.Generator().manual_seed(5)
    sequences: dict[int, list[int]] = {}
    step(model, sequences, {2: random_tokens(generator, 9)}, {2: 0})  # another slot, held
    start = 0
    for size in (20, 33, 3, 24):
        chunk = {1: random_tokens(generator, size)}
        logits = step(model, sequences, chunk, {1: start})
        assert logits is not None
        assert_step_matches_hf(path, logits, sequences, chunk)
        start += size
