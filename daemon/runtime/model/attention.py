"""Grouped-query self-attention over the static KV cache (fused q/k/v projection)."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import causal_lower_right

from daemon.runtime.model import native
from daemon.runtime.model.config import ModelConfig
from daemon.runtime.model.forward_metadata import ForwardMetadata
from daemon.runtime.model.kv_cache import KVCache
from daemon.runtime.model.linear import Linear
from daemon.runtime.model.rmsnorm import RMSNorm
from daemon.runtime.model.rotary import apply_rotary


class Attention(nn.Module):
    def __init__(
        self, config: ModelConfig, layer: int, dtype: torch.dtype, cache_layer: int | None = None
    ) -> None:
        """`layer`: the model's layer index; `cache_layer`: its index in this runner's KV cache
        (a pipeline stage holds only its own layers), by default the same."""
        super().__init__()
        self.layer = layer if cache_layer is None else cache_layer
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.window = config.sliding_window if config.sliding_layers[layer] else None
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.split_sizes = (q_size, kv_size, kv_size)
        hidden = config.hidden_size
        # weight [q + 2 * kv, hidden]: q rows, then k rows, then v rows
        self.qkv_proj = Linear(hidden, sum(self.split_sizes), config.qkv_bias, dtype=dtype)
        self.o_proj = Linear(q_size, hidden, bias=config.o_proj_bias, dtype=dtype)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype)
        # decode and verify chunks by the native kernel (native.py): float32, no q/k norm
        self.is_native = native.enabled() and dtype == torch.float32 and not config.qk_norm

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        meta: ForwardMetadata,
        cache: KVCache,
    ) -> torch.Tensor:
        """`x` [B, T, hidden] -> [B, T, hidden]; writes this chunk's K/V into `cache`."""
        batch, chunk = x.shape[:2]
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        # [B, T, (H + 2 * H_kv) * D]
        qkv = self.qkv_proj(x)
        if self.is_native and meta.native_rows is not None and meta.rope_tables is not None:
            return self.o_proj(self._native(qkv, meta, cache))
        # [B, T, H_kv, D]
        v = qkv[..., sum(self.split_sizes[:2]) :].view(batch, chunk, kv_heads, dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k, _ = qkv.split(self.split_sizes, dim=-1)
            q = self.q_norm(q.view(batch, chunk, heads, dim))
            k = self.k_norm(k.view(batch, chunk, kv_heads, dim))
            q, k = apply_rotary(q, *cos_sin), apply_rotary(k, *cos_sin)
        else:
            # q and k rotated in one call (their heads are adjacent in the fused output):
            # [B, T, H + H_kv, D] -> [B, T, H, D] and [B, T, H_kv, D]
            qk = qkv[..., : sum(self.split_sizes[:2])].view(batch, chunk, heads + kv_heads, dim)
            q, k = apply_rotary(qk, *cos_sin).split((heads, kv_heads), dim=2)
        cache.write(self.layer, meta, k, v)
        if meta.fork is not None:
            out = self._grouped_attention(q.transpose(1, 2), meta, cache)  # [B, H, T, D]
        else:
            out = self._attention(q, meta, cache)
        # [B, T, H * D]
        out = out.transpose(1, 2).reshape(batch, chunk, self.num_heads * self.head_dim)
        return self.o_proj(out)

    def _native(self, qkv: torch.Tensor, meta: ForwardMetadata, cache: KVCache) -> torch.Tensor:
        """The native kernel: rotary, the chunk's K/V written, causal grouped-query attention
        over each row's slot, in one call. qkv [B, T, (H + 2 * H_kv) * D] -> [B, T, H * D]
        (zeros at the pads of shorter chunks)."""
        module = native.kernels()
        assert module is not None and meta.native_rows is not None
        assert meta.rope_tables is not None
        batch, chunk = qkv.shape[:2]
        keys, values = cache.keys[self.layer], cache.values[self.layer]
        cos, signed_sin = meta.rope_tables
        qkv = qkv.contiguous()
        out = qkv.new_empty(batch, chunk, self.num_heads * self.head_dim)
        module.attention(
            qkv.data_ptr(),
            meta.native_rows.data_ptr(),
            cos.data_ptr(),
            signed_sin.data_ptr(),
            keys.data_ptr(),
            values.data_ptr(),
            out.data_ptr(),
            batch,
            chunk,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            keys.shape[2],
            self.window or 0,
            self.head_dim**-0.5,
        )
        return out

    def _attention(self, q: torch.Tensor, meta: ForwardMetadata, cache: KVCache) -> torch.Tensor:
        """q [B, T, H, D] -> [B, H, T, D]. The G = H / H_kv query heads that share a KV head are
        stacked along the query axis, so attention runs over H_kv heads of G * T queries each
        and reads every K/V row once (enable_gqa would expand K/V to H heads: 30-40% slower on
        a CPU at batch 16-32)."""
        chunk = q.shape[1]
        group = self.num_heads // self.num_kv_heads
        # [R, H_kv, L, D]: the attended rows (meta.slot_span)
        k_ctx, v_ctx = cache.read(self.layer, meta)
        if meta.from_zero and (self.window is None or self.window >= meta.context_len):
            # a prefill (L = T): the kernel's causal mode, each query head on its KV head
            # (q [R, H, T, D]); 1.6x faster than the explicit mask at T = 1,000 on a CPU
            out = F.scaled_dot_product_attention(
                meta.to_span(q.transpose(1, 2)), k_ctx, v_ctx, is_causal=True, enable_gqa=True
            )
            return meta.from_span(out)
        if (
            meta.single_row is not None
            and chunk > 1
            and (self.window is None or self.window >= meta.context_len)
        ):
            # one row of T tokens after a cached prefix (a prompt's later chunk, a verify at
            # batch 1): L = start + T, query t sees keys 0..start + t, the causal mask aligned
            # to the lower right. CUDA's flash kernel applies it itself; elsewhere it is built
            # as [T, L] bools, where the stacked mask below is [G * T, L] in the pass's dtype
            return F.scaled_dot_product_attention(
                q.transpose(1, 2),  # [1, H, T, D]
                k_ctx,
                v_ctx,
                attn_mask=causal_lower_right(chunk, meta.context_len),
                enable_gqa=True,
            )
        # [B, H, T, D] -> [R, H, T, D] -> [R, H_kv, G * T, D] (head h = kv head h // G)
        stacked = meta.to_span(q.transpose(1, 2)).reshape(
            -1, self.num_kv_heads, group * chunk, self.head_dim
        )
        out = F.scaled_dot_product_attention(
            stacked, k_ctx, v_ctx, attn_mask=meta.mask(self.window, group, q.dtype)
        )
        # [R, H_kv, G * T, D] -> [R, H, T, D] -> [B, H, T, D]; reshape: CUDA's memory-efficient
        # kernel returns a transposed (non-contiguous) output, which view cannot regroup
        return meta.from_span(out.reshape(-1, self.num_heads, chunk, self.head_dim))

    def _grouped_attention(
        self, q: torch.Tensor, meta: ForwardMetadata, cache: KVCache
    ) -> torch.Tensor:
        """Fork batches: q [B, H, T, D] -> [B, H, T, D], rows attending per group (fork_layout)."""
        fork = meta.fork
        assert fork is not None
        _, heads, chunk, dim = q.shape
        groups, size = fork.num_groups, fork.group_size
        # [U * R, H, T, D] -> [U, H, R * T, D]: each group's members stacked along the queries
        members = q.new_zeros((groups * size, heads, chunk, dim))
        members[fork.member_index] = q
        grouped = members.view(groups, size, heads, chunk, dim).transpose(1, 2)
        # [U, H_kv, L + R * Lb, D]
        k_ctx, v_ctx = cache.read_grouped(self.layer, meta)
        out = F.scaled_dot_product_attention(
            grouped.reshape(groups, heads, size * chunk, dim),
            k_ctx,
            v_ctx,
            attn_mask=fork.mask(self.window),
            enable_gqa=True,
        )
        # [U, H, R * T, D] -> [U * R, H, T, D] -> the batch's rows
        out = out.view(groups, heads, size, chunk, dim).transpose(1, 2)
        return out.reshape(groups * size, heads, chunk, dim)[fork.member_index]
