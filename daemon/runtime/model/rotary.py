"""Rotary position embedding: cos/sin tables built once up to max_model_len, applied per token."""

import torch
from torch import nn

from daemon.runtime.errors import ModelLoadError
from daemon.runtime.model.config import ModelConfig


def inv_freq_and_scaling(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """RoPE inverse frequencies [head_dim // 2] and the cos/sin scale, as transformers has them.

    Scaled variants (linear, dynamic, yarn, llama3) reuse transformers' own `ROPE_INIT_FUNCTIONS`,
    so the tables match its models exactly. "dynamic" only rescales past
    max_position_embeddings, which max_model_len never exceeds, so its initial table is final.
    """
    params = config.rope_parameters
    if config.rope_type == "default":
        exponents = torch.arange(0, config.head_dim, 2, dtype=torch.float) / config.head_dim
        return 1.0 / (params["rope_theta"] ** exponents), 1.0
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    try:
        hf_config = LlamaConfig(
            hidden_size=config.num_attention_heads * config.head_dim,
            num_attention_heads=config.num_attention_heads,
            head_dim=config.head_dim,
            max_position_embeddings=config.max_position_embeddings,
            rope_parameters=dict(params),
        )
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[config.rope_type](hf_config, torch.device("cpu"))
    except (KeyError, TypeError, ValueError) as exc:
        message = f"{config.source}: unsupported field 'rope_parameters': {exc}"
        raise ModelLoadError(message) from exc
    return inv_freq.float(), float(scaling)


class RotaryEmbedding(nn.Module):
    """Holds cos and signed sin for positions 0..max_model_len-1 in the model dtype."""

    def __init__(self, config: ModelConfig, max_model_len: int, dtype: torch.dtype) -> None:
        super().__init__()
        inv_freq, scaling = inv_freq_and_scaling(config)
        # [max_model_len]
        positions = torch.arange(max_model_len, dtype=torch.float)
        # [max_model_len, head_dim // 2]
        freqs = positions[:, None] * inv_freq[None, :]
        # [max_model_len, head_dim]
        angles = torch.cat((freqs, freqs), dim=-1)
        sin = angles.sin() * scaling
        half = sin.shape[-1] // 2
        self.cos = nn.Buffer((angles.cos() * scaling).to(dtype), persistent=False)
        # the first half negated: rotate-half's sign lives in the table (see apply_rotary)
        self.signed_sin = nn.Buffer(
            torch.cat((-sin[:, :half], sin[:, half:]), dim=-1).to(dtype), persistent=False
        )

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin for `positions` [B, T], each [B, T, 1, head_dim] (broadcast over
        heads)."""
        return self.cos[positions].unsqueeze(2), self.signed_sin[positions].unsqueeze(2)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` [B, T, H, D] by cos and signed sin [B, T, 1, D]: HF Llama's rotate-half,
    x * cos + cat(-x2, x1) * sin, written as x * cos + cat(x2, x1) * cat(-sin1, sin2), three
    ops where the plain form takes five (a decode step of a narrow model is bound by them)."""
    half = x.shape[-1] // 2
    # [B, T, H, D]
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return torch.addcmul(x * cos, swapped, signed_sin)
