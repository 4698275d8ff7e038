"""Every user mistake in loading is a ModelLoadError that names what is wrong."""

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from daemon.runtime.errors import ModelLoadError
from daemon.runtime.model import load_model
from tests.tiny_models import make_tiny_checkpoint


@pytest.fixture
def model_dir(tmp_path: Path, llama_dir: Path) -> Path:
    """A private copy of the tiny Llama checkpoint, free to break."""
    return Path(shutil.copytree(llama_dir, tmp_path / "model"))


def _edit_config(path: Path, **changes: object) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"nowhere.*does not exist"):
        load_model(tmp_path / "nowhere")


def test_no_config_json(model_dir: Path) -> None:
    (model_dir / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_model(model_dir)


def test_no_weights(model_dir: Path) -> None:
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"model\.safetensors"):
        load_model(model_dir)


@pytest.mark.parametrize("dtype", ["float64", "fp16", "int8"])
def test_unsupported_dtype(llama_dir: Path, dtype: str) -> None:
    with pytest.raises(ModelLoadError, match=f"unsupported dtype '{dtype}'; choose one of auto"):
        load_model(llama_dir, dtype=dtype)


def test_unsupported_backend(llama_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="unsupported backend 'vllm'"):
        load_model(llama_dir, backend="vllm")


def test_missing_tensor(model_dir: Path) -> None:
    tensors = load_file(model_dir / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"missing tensor 'model\.layers\.1\.self_attn\.k"):
        load_model(model_dir)


def test_shape_mismatch(model_dir: Path) -> None:
    _edit_config(model_dir, intermediate_size=100)
    with pytest.raises(ModelLoadError, match=r"'model.layers.0.mlp.gate_proj.weight' has shape"):
        load_model(model_dir)


def test_missing_config_field(model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    del config["hidden_size"]
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"config\.json: missing field 'hidden_size'"):
        load_model(model_dir)


def test_unsupported_activation(model_dir: Path) -> None:
    _edit_config(model_dir, hidden_act="gelu")
    with pytest.raises(ModelLoadError, match="'hidden_act'"):
        load_model(model_dir)


def test_unsupported_architecture_with_lean_backend(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2)).save_pretrained(
        tmp_path
    )
    with pytest.raises(ModelLoadError, match=r"GPT2LMHeadModel.*not supported by the lean runner"):
        load_model(tmp_path, backend="lean")


def test_max_model_len_beyond_max_position_embeddings(llama_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="max_model_len 1024 exceeds max_position_embeddings"):
        load_model(llama_dir, max_model_len=1024)


def test_bad_num_slots(llama_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="num_slots"):
        load_model(llama_dir, num_slots=0)


def test_sharded_index_names_missing_file(tmp_path: Path) -> None:
    path = make_tiny_checkpoint(tmp_path, sharded=True, with_tokenizer=False)
    next(path.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(ModelLoadError, match=r"model-00002-.*not found"):
        load_model(path)
