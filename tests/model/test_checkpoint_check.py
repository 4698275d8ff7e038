"""check_checkpoint refuses what load_model refuses, with the same message, from config.json and
the safetensors headers alone; and passes every checkpoint load_model loads."""

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from daemon.runtime.errors import ModelLoadError
from daemon.runtime.model import load_model
from daemon.runtime.model.checkpoint_check import check_checkpoint
from tests.model.helpers import TinyFactory


def _edit_config(path: Path, **changes: object) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def _drop_tensor(path: Path) -> None:
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def _truncate(path: Path) -> None:
    file = path / "model.safetensors"
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _not_safetensors(path: Path) -> None:
    (path / "model.safetensors").write_text("<html>403 Forbidden</html>")


# (what breaks, how, the load arguments, what the message says)
BREAKAGES: list[tuple[str, Callable[[Path], None], dict[str, Any], str]] = [
    ("no config", lambda p: (p / "config.json").unlink(), {}, r"no config\.json"),
    ("no weights", lambda p: (p / "model.safetensors").unlink(), {}, r"model\.safetensors"),
    ("missing tensor", _drop_tensor, {}, r"missing tensor 'model\.layers\.1\.mlp\.up_proj"),
    ("truncated", _truncate, {}, r"model\.safetensors: cannot open safetensors file"),
    ("not safetensors", _not_safetensors, {}, r"cannot open safetensors file"),
    ("wider config", lambda p: _edit_config(p, intermediate_size=100), {}, r"has shape"),
    ("fewer heads", lambda p: _edit_config(p, num_key_value_heads=1), {}, r"has shape"),
    ("dtype field", lambda p: _edit_config(p, dtype="float8"), {}, "unsupported field 'dtype'"),
    ("context", lambda p: None, {"max_model_len": 10**6}, r"exceeds max_position_embeddings"),
    ("dtype", lambda p: None, {"dtype": "int8"}, r"unsupported dtype 'int8'"),
    ("backend", lambda p: None, {"backend": "vllm"}, r"unsupported backend 'vllm'"),
    ("tp split", lambda p: None, {"tensor_parallel_size": 3}, "tensor_parallel_size 3 must"),
]


@pytest.mark.parametrize(
    ("breaks", "load_args", "says"),
    [pytest.param(b, a, s, id=i) for i, b, a, s in BREAKAGES],
)
def test_refuses_what_loading_refuses_with_the_same_message(
    tmp_path: Path,
    llama_dir: Path,
    breaks: Callable[[Path], None],
    load_args: dict[str, Any],
    says: str,
) -> None:
    model_dir = Path(shutil.copytree(llama_dir, tmp_path / "model"))
    breaks(model_dir)
    with pytest.raises(ModelLoadError, match=says) as checked:
        check_checkpoint(model_dir, **load_args)
    if "tensor_parallel_size" in load_args:  # a rank loads only inside its group
        return
    with pytest.raises(ModelLoadError, match=says) as loaded:
        load_model(model_dir, **load_args)
    assert str(checked.value) == str(loaded.value)


def test_an_index_naming_a_tensor_its_file_lacks(
    tmp_path: Path, tiny_checkpoint: TinyFactory
) -> None:
    model_dir = Path(shutil.copytree(tiny_checkpoint("llama", sharded=True), tmp_path / "model"))
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    file = index["weight_map"].pop("model.norm.weight")
    index["weight_map"]["model.norm.weight"] = next(
        f for f in set(index["weight_map"].values()) if f != file
    )
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=r"no tensor 'model\.norm\.weight', which model\.s"):
        check_checkpoint(model_dir)
    with pytest.raises(ModelLoadError, match=r"model\.norm\.weight"):
        load_model(model_dir)


@pytest.mark.parametrize(
    ("arch", "build", "load_args"),
    [
        ("llama", {}, {}),
        ("llama", {"sharded": True}, {}),
        ("llama", {"tie_word_embeddings": True}, {"dtype": "bfloat16"}),
        ("qwen2", {}, {"tensor_parallel_size": 2}),
        ("qwen3", {}, {"layers": (0, 1)}),
        ("qwen3", {}, {"layers": (1, 2)}),
        ("mistral", {"num_kv_heads": 1}, {"tensor_parallel_size": 4}),
    ],
)
def test_passes_what_loads(
    tiny_checkpoint: TinyFactory, arch: str, build: dict[str, Any], load_args: dict[str, Any]
) -> None:
    model_dir = tiny_checkpoint(arch, **build)
    check_checkpoint(model_dir, **load_args)
    if "tensor_parallel_size" not in load_args:  # a rank loads only inside its group
        load_model(model_dir, **load_args)


def test_a_pipeline_stage_beyond_the_checkpoints_layers_is_refused(
    tmp_path: Path, llama_dir: Path
) -> None:
    """A stage reads the layers of its own range: a checkpoint with fewer layers than its
    config.json says fails on the stage that reads the missing ones, before it loads."""
    model_dir = Path(shutil.copytree(llama_dir, tmp_path / "model"))
    _edit_config(model_dir, num_hidden_layers=3)
    check_checkpoint(model_dir, layers=(0, 2))
    with pytest.raises(ModelLoadError, match=r"missing tensor 'model\.layers\.2\."):
        check_checkpoint(model_dir, layers=(2, 3))


def test_an_index_entry_no_load_reads_may_be_misplaced(
    tmp_path: Path, tiny_checkpoint: TinyFactory
) -> None:
    """load_model reads only the tensors it needs: a stale index entry for another tensor
    (a head stripped from the files) does not keep it from loading, nor the check."""
    model_dir = Path(shutil.copytree(tiny_checkpoint("llama", sharded=True), tmp_path / "model"))
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.extra_head.weight"] = next(iter(index["weight_map"].values()))
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    check_checkpoint(model_dir)
    load_model(model_dir)


@pytest.fixture
def gpt2_dir(tmp_path: Path) -> Path:
    """A checkpoint the lean runner does not run: transformers loads it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2)).save_pretrained(path)
    return path


def test_the_transformers_fallback_opens_its_files_and_runs_whole(gpt2_dir: Path) -> None:
    check_checkpoint(gpt2_dir)
    load_model(gpt2_dir)
    with pytest.raises(ModelLoadError, match="tensor and pipeline parallelism need the lean"):
        check_checkpoint(gpt2_dir, tensor_parallel_size=2)
    _truncate(gpt2_dir)
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: cannot open safetensors"):
        check_checkpoint(gpt2_dir)
