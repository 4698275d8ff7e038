"""A model's shape from its Hugging Face `config.json`: what the planner and the config checks
need (layers, heads, sizes, vocabulary), and parameter counts worked out from them.

No weights are read and nothing heavy is imported: the TUI calls this on every keystroke.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}
DTYPES = ("auto", *DTYPE_BYTES)
_CHECKPOINT_DTYPE_NAMES = {  # config.json spellings -> ours
    "float32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "half": "float16",
}


class ModelShapeError(Exception):
    """config.json is missing, unreadable or lacks a field; the message names the file."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    architecture: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # per expert for mixture-of-experts models
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    checkpoint_dtype: str | None  # "bfloat16", "fp8", ... or None when config.json is silent
    num_experts: int = 1  # experts per MLP (all resident in memory)
    has_attention_bias: bool = False

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: attention, MLP (all experts), two norms."""
        q_width = self.num_attention_heads * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (q_width + 2 * kv_width) + q_width * self.hidden_size
        if self.has_attention_bias:
            attention += q_width + 2 * kv_width
        mlp = self.num_experts * 3 * self.hidden_size * self.intermediate_size
        router = self.hidden_size * self.num_experts if self.num_experts > 1 else 0
        return attention + mlp + router + 2 * self.hidden_size

    @property
    def num_params(self) -> int:
        """All parameters; a tied LM head shares the embedding matrix."""
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        final_norm = self.hidden_size
        return self.embedding_params + self.num_layers * self.layer_params + final_norm + lm_head

    def kv_bytes_per_token_per_layer(self, kv_dtype_bytes: int, tensor_parallel_size: int) -> int:
        """K and V of one token in one layer on one tensor-parallel rank.

        KV heads are split across ranks; with more ranks than KV heads each rank keeps one
        (replicated) head, as vLLM does."""
        heads_per_rank = max(1, self.num_kv_heads // tensor_parallel_size)
        return 2 * heads_per_rank * self.head_dim * kv_dtype_bytes

    def resolve_dtype(self, dtype: str) -> str:
        """The dtype the weights are held in: `dtype`, or for "auto" the checkpoint's own
        (float32 when config.json names none, as transformers loads it)."""
        if dtype != "auto":
            return dtype
        return self.checkpoint_dtype or "float32"


def read_model_shape(model_dir: Path) -> ModelShape:
    """Read `model_dir/config.json`; raise ModelShapeError naming the file and the problem."""
    config_file = model_dir / "config.json"
    if not model_dir.is_dir():
        if model_dir.exists():
            raise ModelShapeError(
                f"{model_dir} is a file; give the model directory (where config.json and the "
                "weights are)"
            )
        raise ModelShapeError(f"model directory {model_dir} does not exist")
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelShapeError(
            f"{config_file} not found (a model directory holds a Hugging Face config.json)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelShapeError(f"{config_file}: cannot read it: {error}") from None
    return shape_from_file(raw, str(config_file))


def shape_from_file(raw: Any, source: str) -> ModelShape:
    """The shape a whole config.json (`raw`, parsed) describes: a multimodal checkpoint's is
    its `text_config`'s."""
    if not isinstance(raw, dict):
        raise ModelShapeError(f"{source}: not a JSON object")
    if "num_hidden_layers" not in raw and "text_config" in raw:
        raw = raw["text_config"]
        if not isinstance(raw, dict):
            raise ModelShapeError(f"{source}: 'text_config' must be a JSON object")
    return shape_from_config(raw, source)


def shape_from_config(raw: dict[str, Any], source: str) -> ModelShape:
    hidden = _positive_int(raw, "hidden_size", source)
    num_heads = _positive_int(raw, "num_attention_heads", source)
    head_dim = _optional_positive_int(raw, "head_dim", source) or hidden // num_heads
    if head_dim < 1:
        raise ModelShapeError(
            f"{source}: 'hidden_size' {hidden} is below 'num_attention_heads' {num_heads}, and no "
            "'head_dim' says how wide a head is"
        )
    num_experts = (
        _optional_positive_int(raw, "num_local_experts", source)
        or _optional_positive_int(raw, "num_experts", source)
        or 1
    )
    intermediate_key = "moe_intermediate_size" if "moe_intermediate_size" in raw else None
    architectures = raw.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        architectures = [raw.get("model_type", "unknown")]
    return ModelShape(
        architecture=str(architectures[0]),
        hidden_size=hidden,
        num_layers=_positive_int(raw, "num_hidden_layers", source),
        num_attention_heads=num_heads,
        num_kv_heads=_optional_positive_int(raw, "num_key_value_heads", source) or num_heads,
        head_dim=head_dim,
        intermediate_size=_positive_int(raw, intermediate_key or "intermediate_size", source),
        vocab_size=_positive_int(raw, "vocab_size", source),
        max_position_embeddings=_positive_int(raw, "max_position_embeddings", source),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        checkpoint_dtype=_checkpoint_dtype(raw),
        num_experts=num_experts,
        has_attention_bias=bool(raw.get("attention_bias", False))
        or str(raw.get("model_type")) == "qwen2",
    )


def _positive_int(raw: dict[str, Any], key: str, source: str) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        shown = "missing" if value is None else f"{value!r}"
        raise ModelShapeError(f"{source}: '{key}' must be a positive integer, got {shown}")
    return value


def _optional_positive_int(raw: dict[str, Any], key: str, source: str) -> int | None:
    """`key`'s value where it is set (a positive integer, else ModelShapeError); None where
    it is absent, null or 0 (the caller's default applies: transformers writes 0 for a
    head_dim it derives)."""
    if raw.get(key) is None or (type(raw.get(key)) is int and raw[key] == 0):
        return None
    return _positive_int(raw, key, source)


def _checkpoint_dtype(raw: dict[str, Any]) -> str | None:
    quantization = raw.get("quantization_config")
    if isinstance(quantization, dict) and str(quantization.get("quant_method")) == "fp8":
        return "fp8"
    name = raw.get("dtype") or raw.get("torch_dtype")
    return _CHECKPOINT_DTYPE_NAMES.get(str(name)) if name else None
