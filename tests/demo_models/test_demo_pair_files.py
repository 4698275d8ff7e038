"""The committed demo pair: loadable by transformers, compatible, within size, held-out prompts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "packaging" / "demo-models"
PROMPTS = REPO / "packaging" / "demo_models" / "prompts"
sys.path.insert(0, str(REPO / "packaging" / "demo_models"))

import stdlib_corpus  # noqa: E402

DIRS = {"target": DEMO / "target", "draft": DEMO / "draft"}
MAX_BYTES = 25 * 1000 * 1000
SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F32": "float32", "F16": "float16"}


def _config(name: str) -> dict:
    return json.loads((DIRS[name] / "config.json").read_text())


def _tensor_stats(name: str) -> tuple[dict[str, int], set[str]]:
    sizes, dtypes = {}, set()
    with safe_open(DIRS[name] / "model.safetensors", "pt") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
            sl = f.get_slice(key)
            sizes[key] = int(torch.Size(sl.get_shape()).numel())
            dtypes.add(sl.get_dtype())
    return sizes, dtypes


@pytest.mark.parametrize("name", sorted(DIRS))
def test_loads_with_transformers(name: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(DIRS[name])
    tok = AutoTokenizer.from_pretrained(DIRS[name])
    assert model.config.model_type == "llama"
    assert model.config.head_dim == 64
    assert model.config.vocab_size == len(tok)
    assert tok.eos_token == "<|endoftext|>"
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok("def f(x):\n    return x", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids["input_ids"].shape[1] + 4


@pytest.mark.parametrize("name", sorted(DIRS))
def test_required_files_and_stored_dtype(name: str) -> None:
    for fname in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (DIRS[name] / fname).is_file(), fname
    tok_cfg = json.loads((DIRS[name] / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_cfg["chat_template"]
    _, dtypes = _tensor_stats(name)
    assert {SAFETENSORS_DTYPES[d] for d in dtypes} == {_config(name)["torch_dtype"]}


def test_same_tokenizer_and_vocab() -> None:
    for fname in ("tokenizer.json", "tokenizer_config.json"):
        assert (DIRS["target"] / fname).read_bytes() == (DIRS["draft"] / fname).read_bytes()
    assert _config("target")["vocab_size"] == _config("draft")["vocab_size"]


def test_parameter_ratio_at_least_5() -> None:
    counts = {}
    for name in DIRS:
        sizes, _ = _tensor_stats(name)
        emb = sizes["model.embed_tokens.weight"]
        counts[name] = (sum(sizes.values()), sum(sizes.values()) - emb)
    assert counts["target"][0] >= 5 * counts["draft"][0]
    assert counts["target"][1] >= 5 * counts["draft"][1]


def test_total_size_within_budget() -> None:
    total = sum(p.stat().st_size for d in DIRS.values() for p in d.iterdir() if p.is_file())
    assert total <= MAX_BYTES, total


@pytest.mark.parametrize("kind", ["code", "prose"])
def test_prompts_are_held_out(kind: str) -> None:
    rows = [json.loads(line) for line in (PROMPTS / f"{kind}.jsonl").read_text().splitlines()]
    assert len(rows) >= 8
    for row in rows:
        assert len(row["prompt"]) >= 150
        assert row["source"] == "handwritten" or stdlib_corpus.is_held_out(row["source"])
