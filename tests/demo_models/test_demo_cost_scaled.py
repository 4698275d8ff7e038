"""The cost-scaled targets (narrow: more layers; wide: wider MLPs) predict exactly what the
trained target predicts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "packaging" / "demo-models"
PROMPTS = REPO / "packaging" / "demo_models" / "prompts"
sys.path.insert(0, str(REPO / "packaging" / "demo_models"))

from cost_scale import (  # noqa: E402
    build_cost_scaled_target,
    build_wide_target,
    decode_flops,
    extra_layers_for_ratio,
)


def _cfg(d: Path) -> dict:
    return json.loads((d / "config.json").read_text())


WIDE = 4096  # the bench's is 16384; the check is the same at any width


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wide_target(DEMO / "target", tmp_path_factory.mktemp("wide") / "t", WIDE)


@pytest.fixture(scope="module")
def scaled_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cost_scaled_target(DEMO / "target", tmp_path_factory.mktemp("scaled") / "t")


def test_layer_count_and_cost_ratio(scaled_dir: Path) -> None:
    base, draft, scaled = _cfg(DEMO / "target"), _cfg(DEMO / "draft"), _cfg(scaled_dir)
    extra = extra_layers_for_ratio(base, draft, 30.0)
    assert extra > 0
    assert scaled["num_hidden_layers"] == base["num_hidden_layers"] + extra
    assert 20 <= decode_flops(scaled) / decode_flops(draft) <= 40


def test_added_layers_have_zero_output_projections(scaled_dir: Path) -> None:
    trained = _cfg(DEMO / "target")["num_hidden_layers"]
    total = _cfg(scaled_dir)["num_hidden_layers"]
    tensors = load_file(scaled_dir / "model.safetensors")
    for i in range(trained, total):
        assert not tensors[f"model.layers.{i}.self_attn.o_proj.weight"].any()
        assert not tensors[f"model.layers.{i}.mlp.down_proj.weight"].any()
        assert tensors[f"model.layers.{i}.self_attn.q_proj.weight"].any()


def test_explicit_extra_layers(tmp_path: Path) -> None:
    out = build_cost_scaled_target(DEMO / "target", tmp_path / "t", extra_layers=2)
    assert _cfg(out)["num_hidden_layers"] == _cfg(DEMO / "target")["num_hidden_layers"] + 2


def test_wide_target_shapes(wide_dir: Path) -> None:
    base, wide = _cfg(DEMO / "target"), _cfg(wide_dir)
    assert wide["intermediate_size"] == WIDE and wide["torch_dtype"] == "float32"
    assert wide["num_hidden_layers"] == base["num_hidden_layers"]
    tensors = load_file(wide_dir / "model.safetensors")
    trained = base["intermediate_size"]
    down = tensors["model.layers.0.mlp.down_proj.weight"]
    assert down.shape == (base["hidden_size"], WIDE) and down.dtype == torch.float32
    assert not down[:, trained:].any() and down[:, :trained].any()
    assert tensors["model.layers.0.mlp.gate_proj.weight"][trained:].any()  # real work


def test_wide_target_refuses_narrowing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="below the trained width"):
        build_wide_target(DEMO / "target", tmp_path / "t", 64)


def test_wide_greedy_output_equals_trained_target_in_lean_runner(wide_dir: Path) -> None:
    from daemon.runtime.model import load_model
    from daemon.runtime.model.batch import ForwardBatch, LogitsMode

    tok = AutoTokenizer.from_pretrained(DEMO / "target")
    row = json.loads((PROMPTS / "code.jsonl").read_text().splitlines()[0])
    ids = tok(row["prompt"])["input_ids"]
    outs = []
    for model_dir in (DEMO / "target", wide_dir):
        model = load_model(model_dir, dtype="float32", num_slots=1)
        seq = list(ids)
        logits = model.forward(ForwardBatch([0], [seq], [0], LogitsMode.LAST))
        for _ in range(24):
            assert logits is not None
            seq.append(int(logits[0].argmax()))
            logits = model.forward(ForwardBatch([0], [seq[-1:]], [len(seq) - 1], LogitsMode.LAST))
        outs.append(seq)
    assert outs[0] == outs[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_output_equals_trained_target(scaled_dir: Path, dtype: torch.dtype) -> None:
    tok = AutoTokenizer.from_pretrained(DEMO / "target")
    base = AutoModelForCausalLM.from_pretrained(DEMO / "target", dtype=dtype)
    scaled = AutoModelForCausalLM.from_pretrained(scaled_dir, dtype=dtype)
    rows = [json.loads(x) for x in (PROMPTS / "code.jsonl").read_text().splitlines()[:3]]
    rows += [json.loads((PROMPTS / "prose.jsonl").read_text().splitlines()[0])]
    for row in rows:
        ids = tok(row["prompt"], return_tensors="pt")
        a = base.generate(**ids, max_new_tokens=24, do_sample=False)
        b = scaled.generate(**ids, max_new_tokens=24, do_sample=False)
        assert torch.equal(a, b), row["id"]
