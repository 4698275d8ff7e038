"""Megatron-style tensor-parallel sharding of the lean runner's weights.

Column-parallel (output rows split, no communication): the fused q/k/v projection by heads and
the fused gate/up projection by MLP columns; each fused part is split on its own, so a rank
holds its q heads, its K/V heads (the ones its q heads read under grouped-query attention) and
its gate and up columns. Row-parallel (input columns split, outputs summed by an all-reduce):
o_proj and down_proj; their bias is added once, by rank 0. Embeddings, norms and the LM head are
replicated.
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
    fields = {
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "intermediate_size": config.intermediate_size,
    }
    bad = [f"{name} ({value})" for name, value in fields.items() if value % size]
    if bad:
        raise ModelLoadError(
            f"{config.source}: tensor_parallel_size {size} must divide {', '.join(bad)}; "
            f"choose a size that divides every one of {', '.join(fields)}"
        )
    return dataclasses.replace(config, **{name: value // size for name, value in fields.items()})


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
