"""Megatron-style tensor-parallel sharding of the lean runner's weights.

Column-parallel (output rows split, no communication): the fused q/k/v projection by heads and
the fused gate/up projection by MLP columns; each fused part is split on its own, so a rank
holds its q heads, its K/V heads (the ones its q heads read under grouped-query attention) and
its gate and up columns. Row-parallel (input columns split, outputs summed by an all-reduce):
o_proj and down_proj; their bias is added once, by rank 0. Embeddings, norms and the LM head are
replicated. With more ranks than K/V heads (size a multiple of num_key_value_heads), each K/V
head is replicated on the size / num_key_value_heads ranks whose q heads read it.
"""

import dataclasses

import torch

from daemon.runtime.errors import ModelLoadError
from daemon.runtime.model.config import ModelConfig

ROW_PARALLEL = ("o_proj", "down_proj")


def shard_config(config: ModelConfig, size: int) -> ModelConfig:
    """The per-rank shape of `config` split over `size` ranks (heads and MLP columns / size)."""
    if size == 1:
        return config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    bad = [
        f"{name} ({value})"
        for name, value in (
            ("num_attention_heads", heads),
            ("intermediate_size", config.intermediate_size),
        )
        if value % size
    ]
    if kv_heads % size and size % kv_heads:
        bad.append(f"num_key_value_heads ({kv_heads}; nor is it a multiple of it)")
    if bad:
        raise ModelLoadError(
            f"{config.source}: tensor_parallel_size {size} must divide {', '.join(bad)}"
        )
    return dataclasses.replace(
        config,
        num_attention_heads=heads // size,
        num_key_value_heads=max(1, kv_heads // size),
        intermediate_size=config.intermediate_size // size,
    )


def fused_part(config: ModelConfig, part: str, rank: int, size: int) -> tuple[int, int, int]:
    """For one part of a fused projection (q_proj, k_proj, v_proj, gate_proj, up_proj) of the
    whole model `config`: (its rows in the checkpoint, the chunks they split into, the chunk
    rank `rank` holds)."""
    if part in ("k_proj", "v_proj"):
        kv_heads = config.num_key_value_heads
        rows = kv_heads * config.head_dim
        if kv_heads % size == 0:
            return rows, size, rank
        return rows, kv_heads, rank // (size // kv_heads)  # replicated K/V heads
    if part == "q_proj":
        return config.num_attention_heads * config.head_dim, size, rank
    return config.intermediate_size, size, rank


def rank_part(tensor: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    """Rank `rank`'s contiguous 1/size of `tensor` along `dim`."""
    step = tensor.shape[dim] // size
    return tensor.narrow(dim, rank * step, step).contiguous()


def full_shape(module_name: str, kind: str, local: tuple[int, ...], size: int) -> tuple[int, ...]:
    """The checkpoint's shape of a row-parallel parameter whose per-rank shape is `local`."""
    if module_name in ROW_PARALLEL and kind == "weight":
        return (local[0], local[1] * size)
    return local


def shard_row_parallel(tensor: torch.Tensor, kind: str, rank: int, size: int) -> torch.Tensor:
    """A row-parallel weight keeps its input columns; its bias stays whole on rank 0 only."""
    if kind == "weight":
        return rank_part(tensor, 1, rank, size)
    return tensor if rank == 0 else torch.zeros_like(tensor)
