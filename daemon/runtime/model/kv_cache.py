"""Static per-slot KV cache: preallocated once, rolled back by moving a length (never copied)."""

import torch

from daemon.runtime.model.forward_metadata import ForwardMetadata


class KVCache:
    """Per layer, K and V of every slot: [num_slots, num_kv_heads, max_model_len, head_dim].

    Zero-filled, so stale or never-written positions hold finite values that a mask can hide.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        max_model_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_slots, num_kv_heads, max_model_len, head_dim)
        # num_layers x [S, H_kv, M, D]
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def write(self, layer: int, meta: ForwardMetadata, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the K/V [B, T, H_kv, D] of the batch's real (non-pad) tokens at their positions."""
        # [N, H_kv, D] (N = real tokens in the batch)
        k_real = k[meta.write_rows, meta.write_cols]
        v_real = v[meta.write_rows, meta.write_cols]
        self.keys[layer][meta.write_slots, :, meta.write_positions] = k_real
        self.values[layer][meta.write_slots, :, meta.write_positions] = v_real

    def read(self, layer: int, meta: ForwardMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the batch's slots for positions 0..L-1: each [B, H_kv, L, D]."""
        length = meta.context_len
        if meta.slot_range is not None:  # consecutive slots: a view, no copy
            start, stop = meta.slot_range
            return (
                self.keys[layer][start:stop, :, :length],
                self.values[layer][start:stop, :, :length],
            )
        return self.keys[layer][meta.slots, :, :length], self.values[layer][meta.slots, :, :length]
