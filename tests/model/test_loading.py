"""load_model: dtypes, sharded checkpoints, backend choice, max_model_len."""

from pathlib import Path

import torch

from daemon.runtime.model import LogitsMode, load_model
from daemon.runtime.model.hf_fallback import HFCausalLM
from daemon.runtime.model.llama import LlamaForCausalLM
from tests.model.helpers import TinyFactory, assert_step_matches_hf, hf_logits, step
from tests.tiny_models import make_tiny_checkpoint

TOKENS = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]


def _logits(path: Path, **kwargs: object) -> torch.Tensor:
    logits = step(load_model(path, **kwargs), {}, {0: TOKENS}, {0: 0})  # type: ignore[arg-type]
    assert logits is not None
    return logits[0]


def test_bfloat16_checkpoint_loads_in_its_own_dtype(tiny_checkpoint: TinyFactory) -> None:
    path = tiny_checkpoint("llama", dtype=torch.bfloat16)
    model = load_model(path)
    assert model.dtype == torch.bfloat16
    assert isinstance(model, LlamaForCausalLM) and model.cache.keys[0].dtype == torch.bfloat16
    logits = _logits(path)
    assert logits.dtype == torch.float32
    expected = hf_logits(path, TOKENS, torch.bfloat16)
    torch.testing.assert_close(logits, expected, atol=0.1, rtol=0.02)


def test_dtype_override(tiny_checkpoint: TinyFactory) -> None:
    path = tiny_checkpoint("llama", dtype=torch.bfloat16)
    assert load_model(path, dtype="float32").dtype == torch.float32
    assert load_model(tiny_checkpoint("llama"), dtype="float16").dtype == torch.float16


def test_sharded_checkpoint_equals_single_file(tiny_checkpoint: TinyFactory) -> None:
    sharded = tiny_checkpoint("qwen2", sharded=True)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert not (sharded / "model.safetensors").exists()
    single = tiny_checkpoint("qwen2")
    torch.testing.assert_close(_logits(sharded), _logits(single), atol=0, rtol=0)
    sequences: dict[int, list[int]] = {}
    logits = step(load_model(sharded), sequences, {0: TOKENS}, {0: 0})
    assert_step_matches_hf(sharded, logits, sequences, {0: TOKENS})


def test_backend_choice(llama_dir: Path) -> None:
    assert isinstance(load_model(llama_dir), LlamaForCausalLM)
    assert isinstance(load_model(llama_dir, backend="lean"), LlamaForCausalLM)
    assert isinstance(load_model(llama_dir, backend="hf"), HFCausalLM)


def test_other_architecture_uses_transformers(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=320, n_embd=32, n_layer=1, n_head=2, n_positions=128)
    GPT2LMHeadModel(config).save_pretrained(tmp_path)
    model = load_model(tmp_path, num_slots=2)
    assert isinstance(model, HFCausalLM)
    assert model.max_model_len == 128 and model.vocab_size == 320
    sequences: dict[int, list[int]] = {}
    logits = step(model, sequences, {1: TOKENS}, {1: 0})
    assert_step_matches_hf(tmp_path, logits, sequences, {1: TOKENS})
    logits = step(model, sequences, {1: [4, 5]}, {1: 4}, LogitsMode.ALL)
    assert_step_matches_hf(tmp_path, logits, sequences, {1: [4, 5]})


def test_max_model_len(tiny_checkpoint: TinyFactory) -> None:
    path = tiny_checkpoint("llama", max_position_embeddings=8192)
    model = load_model(path, num_slots=3)
    assert model.max_model_len == 4096 and model.num_slots == 3
    assert isinstance(model, LlamaForCausalLM)
    assert model.cache.keys[0].shape == (3, 2, 4096, 16)
    assert load_model(path, max_model_len=8192).max_model_len == 8192
    assert load_model(tiny_checkpoint("llama"), max_model_len=100).max_model_len == 100


def test_legacy_torch_dtype_key(tmp_path: Path) -> None:
    import json

    path = make_tiny_checkpoint(tmp_path, dtype=torch.bfloat16, with_tokenizer=False)
    config = json.loads((path / "config.json").read_text())
    config["torch_dtype"] = config.pop("dtype")
    (path / "config.json").write_text(json.dumps(config))
    assert load_model(path).dtype == torch.bfloat16
    assert load_model(path, backend="hf").dtype == torch.bfloat16
