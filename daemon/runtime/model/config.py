"""ModelConfig: the fields of a Hugging Face config.json the lean Llama-family runner needs."""

from dataclasses import dataclass, field
from typing import Any

import torch

from daemon.runtime.errors import ModelLoadError

LEAN_ARCHITECTURES = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MistralForCausalLM",
)
LEAN_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_REQUIRED_INTS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


@dataclass(slots=True)
class ModelConfig:
    """A Llama-family decoder, as described by config.json (`source` names the file)."""

    source: str
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_parameters: dict[str, Any] = field(default_factory=dict)  # rope_type, rope_theta, ...
    qkv_bias: bool = False  # q/k/v projections have biases (Qwen2 always)
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k, before rotary
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()  # [num_hidden_layers] layer uses the sliding window
    hidden_act: str = "silu"
    dtype: torch.dtype | None = None  # the checkpoint's own dtype, if it names one

    def __post_init__(self) -> None:
        self._check(self.num_attention_heads % self.num_key_value_heads == 0, "num_key_value_heads")
        self._check(self.head_dim > 0 and self.head_dim % 2 == 0, "head_dim")
        self._check(self.hidden_act == "silu", "hidden_act")
        self._check(self.sliding_window is None or self.sliding_window > 0, "sliding_window")
        if not self.sliding_layers:
            self.sliding_layers = (self.sliding_window is not None,) * self.num_hidden_layers
        self._check(len(self.sliding_layers) == self.num_hidden_layers, "layer_types")

    def _check(self, ok: bool, field_name: str) -> None:
        if not ok:
            value = getattr(self, field_name, None)
            raise ModelLoadError(f"{self.source}: unsupported value of '{field_name}': {value!r}")

    @property
    def rope_type(self) -> str:
        return str(self.rope_parameters.get("rope_type", "default"))

    @property
    def is_lean_supported(self) -> bool:
        return self.architecture in LEAN_ARCHITECTURES and self.rope_type in LEAN_ROPE_TYPES

    @classmethod
    def from_dict(cls, raw: dict[str, Any], *, source: str) -> "ModelConfig":
        """Build from the parsed config.json of a Llama / Qwen2 / Qwen3 / Mistral checkpoint."""
        ints = {name: _required(raw, name, int, source) for name in _REQUIRED_INTS}
        num_heads = ints["num_attention_heads"]
        architecture = _architecture(raw, source)
        sliding_window = _sliding_window(raw, architecture)
        return cls(
            source=source,
            architecture=architecture,
            **ints,
            num_key_value_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or ints["hidden_size"] // num_heads),
            max_position_embeddings=_required(raw, "max_position_embeddings", int, source),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_parameters=_rope_parameters(raw, source),
            **_biases(raw, architecture),
            qk_norm=architecture == "Qwen3ForCausalLM",
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            sliding_window=sliding_window,
            sliding_layers=_sliding_layers(raw, architecture, sliding_window, ints),
            hidden_act=str(raw.get("hidden_act", "silu")),
            dtype=_checkpoint_dtype(raw),
        )


def _required(raw: dict[str, Any], name: str, kind: type, source: str) -> Any:
    value = raw.get(name)
    if value is None:
        raise ModelLoadError(f"{source}: missing field '{name}'")
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ModelLoadError(f"{source}: field '{name}' must be {kind.__name__}, got {value!r}")
    return value


def _architecture(raw: dict[str, Any], source: str) -> str:
    architectures = raw.get("architectures")
    if not architectures or not isinstance(architectures, list):
        raise ModelLoadError(f"{source}: missing field 'architectures'")
    return str(architectures[0])


def _biases(raw: dict[str, Any], architecture: str) -> dict[str, bool]:
    """Which linear layers carry a bias, as each architecture's transformers code builds them."""
    attention_bias = bool(raw.get("attention_bias", False))
    if architecture == "Qwen2ForCausalLM":  # q/k/v biases always, none elsewhere
        return {"qkv_bias": True, "o_proj_bias": False, "mlp_bias": False}
    if architecture == "MistralForCausalLM":
        return {"qkv_bias": False, "o_proj_bias": False, "mlp_bias": False}
    mlp_bias = architecture == "LlamaForCausalLM" and bool(raw.get("mlp_bias", False))
    return {"qkv_bias": attention_bias, "o_proj_bias": attention_bias, "mlp_bias": mlp_bias}


def _rope_parameters(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """transformers 5 `rope_parameters`, or the older `rope_theta` + `rope_scaling` pair."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    if "type" in params:
        params.setdefault("rope_type", params.pop("type"))
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", float(raw.get("rope_theta", 10000.0)))
    if params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ModelLoadError(f"{source}: unsupported field 'partial_rotary_factor'")
    original_max = raw.get("original_max_position_embeddings")
    if original_max is not None:
        params.setdefault("original_max_position_embeddings", original_max)
    return params


def _sliding_window(raw: dict[str, Any], architecture: str) -> int | None:
    window = raw.get("sliding_window")
    if architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and not raw.get(
        "use_sliding_window", False
    ):
        return None
    return int(window) if window else None


def _sliding_layers(
    raw: dict[str, Any], architecture: str, window: int | None, ints: dict[str, int]
) -> tuple[bool, ...]:
    num_layers = ints["num_hidden_layers"]
    if window is None:
        return (False,) * num_layers
    layer_types = raw.get("layer_types")
    if layer_types:
        return tuple(kind == "sliding_attention" for kind in layer_types)
    if architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        first = int(raw.get("max_window_layers", num_layers))
        return tuple(i >= first for i in range(num_layers))
    return (True,) * num_layers


def _checkpoint_dtype(raw: dict[str, Any]) -> torch.dtype | None:
    """The dtype config.json names, if one the runner supports (load_model checks "auto")."""
    return DTYPES.get(raw.get("dtype") or raw.get("torch_dtype") or "")
