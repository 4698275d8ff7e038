"""Model shapes from config.json: parameter counts against published sizes and against the
demo pair's real safetensors files."""

import json
import re
import struct
from pathlib import Path

import pytest

from specctl.config.model_shape import ModelShapeError, read_model_shape, shape_from_config

from .cluster_files import EXAMPLES, REPO_ROOT, llama_config

DEMO = REPO_ROOT / "packaging" / "demo-models"


def _safetensors_num_params(path: Path) -> int:
    """Count parameters from a safetensors header (8-byte length, then JSON)."""
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    total = 0
    for name, entry in header.items():
        if name != "__metadata__":
            count = 1
            for dim in entry["shape"]:
                count *= dim
            total += count
    return total


@pytest.mark.parametrize("name", ["target", "draft"])
def test_parameter_count_matches_the_demo_checkpoint(name: str) -> None:
    shape = read_model_shape(DEMO / name)
    assert shape.num_params == _safetensors_num_params(DEMO / name / "model.safetensors")


def test_published_sizes_of_the_example_models() -> None:
    big = read_model_shape(EXAMPLES / "models" / "llama-3.3-70b-instruct")
    small = read_model_shape(EXAMPLES / "models" / "llama-3.1-8b-instruct")
    assert round(big.num_params / 1e9, 1) == 70.6
    assert round(small.num_params / 1e9, 2) == 8.03
    assert (big.num_layers, big.num_kv_heads, big.head_dim, big.vocab_size) == (80, 8, 128, 128256)
    assert big.resolve_dtype("auto") == "bfloat16"


def test_kv_bytes_per_token_split_and_replicated_across_ranks() -> None:
    shape = shape_from_config(llama_config(), "test")  # 2 KV heads of 16
    assert shape.kv_bytes_per_token_per_layer(2, 1) == 2 * 2 * 16 * 2
    assert shape.kv_bytes_per_token_per_layer(2, 2) == 2 * 1 * 16 * 2
    assert shape.kv_bytes_per_token_per_layer(2, 4) == 2 * 1 * 16 * 2  # replicated head


def test_fp8_checkpoint_and_missing_fields(tmp_path: Path) -> None:
    config = llama_config(quantization_config={"quant_method": "fp8"})
    assert shape_from_config(config, "x").resolve_dtype("auto") == "fp8"
    del config["torch_dtype"], config["quantization_config"]
    assert shape_from_config(config, "x").resolve_dtype("auto") == "float32"
    broken = llama_config()
    del broken["num_hidden_layers"]
    with pytest.raises(ModelShapeError, match=r"'num_hidden_layers' must be a positive integer"):
        shape_from_config(broken, "m/config.json")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelShapeError, match=r"config\.json: cannot read it"):
        read_model_shape(tmp_path)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"num_key_value_heads": "eight"},
            "'num_key_value_heads' must be a positive integer, got 'eight'",
        ),
        ({"num_key_value_heads": [8]}, "'num_key_value_heads' must be a positive integer, got [8]"),
        ({"num_key_value_heads": -8}, "'num_key_value_heads' must be a positive integer, got -8"),
        ({"head_dim": "x"}, "'head_dim' must be a positive integer, got 'x'"),
        ({"head_dim": 127.5}, "'head_dim' must be a positive integer, got 127.5"),
        ({"num_local_experts": -4}, "'num_local_experts' must be a positive integer, got -4"),
        ({"num_experts": "x"}, "'num_experts' must be a positive integer, got 'x'"),
        (
            {"hidden_size": 2, "num_attention_heads": 4, "head_dim": None},
            "'hidden_size' 2 is below 'num_attention_heads' 4",
        ),
    ],
)
def test_a_malformed_optional_field_is_named(overrides: dict, expected: str) -> None:
    """Fields with a default (null or absent: the default) must still hold a positive integer
    where set: read as int() they raised ValueError (a traceback in `plan`), and negative
    ones planned negative memory that "fits"."""
    with pytest.raises(ModelShapeError, match=rf"^m/config\.json: {re.escape(expected)}"):
        shape_from_config(llama_config(**overrides), "m/config.json")


@pytest.mark.parametrize("unset", [None, 0])
def test_optional_fields_left_unset_take_their_defaults(unset: object) -> None:
    shape = shape_from_config(
        llama_config(num_key_value_heads=unset, head_dim=unset, num_local_experts=unset), "x"
    )
    assert (shape.num_kv_heads, shape.head_dim, shape.num_experts) == (4, 16, 1)


@pytest.mark.parametrize("text_config", [None, "x", [1]])
def test_a_text_config_that_is_not_an_object_is_named(tmp_path: Path, text_config: object) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"text_config": text_config}))
    with pytest.raises(ModelShapeError, match=r"'text_config' must be a JSON object"):
        read_model_shape(tmp_path)


def test_a_multimodal_checkpoint_reads_its_text_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"text_config": llama_config()}))
    assert read_model_shape(tmp_path).num_layers == 8
