"""Llama shapes of the demo pair (head_dim 64 everywhere: vLLM's CPU attention needs it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

HEAD_DIM = 64


@dataclass(frozen=True)
class ModelSpec:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    max_positions: int = 2048

    def to_config(self, vocab_size: int, eos_id: int = 0) -> LlamaConfig:
        assert self.hidden == self.heads * HEAD_DIM, "hidden must be heads * 64"
        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=self.hidden,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            head_dim=HEAD_DIM,
            intermediate_size=self.intermediate,
            max_position_embeddings=self.max_positions,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            hidden_act="silu",
            bos_token_id=eos_id,
            eos_token_id=eos_id,
            pad_token_id=eos_id,
            attention_bias=False,
            mlp_bias=False,
            initializer_range=0.02,
        )


TARGET = ModelSpec(hidden=256, layers=6, heads=4, kv_heads=2, intermediate=704)
DRAFT = ModelSpec(hidden=128, layers=2, heads=2, kv_heads=2, intermediate=384)
# --quick smoke run: same head_dim, minimal everything else.
QUICK_TARGET = ModelSpec(hidden=128, layers=2, heads=2, kv_heads=2, intermediate=256)
QUICK_DRAFT = ModelSpec(hidden=64, layers=1, heads=1, kv_heads=1, intermediate=128)


def build_model(spec: ModelSpec, vocab_size: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(spec.to_config(vocab_size))
    model.config.use_cache = True
    return model


def count_params(model: torch.nn.Module) -> dict[str, int]:
    """Total (tied embedding counted once) and non-embedding parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight.numel()
    return {"total": total, "non_embedding": total - emb}
