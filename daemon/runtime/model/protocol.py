"""The surface every causal LM runner offers the engine (lean Llama-family runner, HF fallback)."""

from typing import Protocol

import torch

from daemon.runtime.model.batch import ForwardBatch


class CausalLM(Protocol):
    """A causal LM with a per-slot KV cache.

    A slot holds one sequence. The runner keeps no notion of a sequence's length of its own
    beyond what `ForwardBatch.start_positions` tells it on each call.
    """

    vocab_size: int  # rows of the LM head (logits width)
    max_model_len: int  # tokens one slot can hold
    num_slots: int
    device: torch.device
    dtype: torch.dtype

    def forward(self, batch: ForwardBatch) -> torch.Tensor | None:
        """Run one pass; logits are float32, shape depends on `batch.logits_mode`:
        ALL -> [B, T_max, V]; LAST -> [B, V]; NONE -> None."""
        ...

    def free_slot(self, slot: int) -> None:
        """Forget the slot's cache (a finished sequence); the slot may be reused."""
        ...


class ForkingCausalLM(CausalLM, Protocol):
    """A runner that takes fork rows (see ForwardBatch): branches of a sequence that read the
    parent slot's context and keep only their own few tokens in a branch cache."""

    supports_forks: bool

    def enable_forks(self, num_branch_slots: int, branch_len: int) -> None:
        """Allocate the branch cache (existing branches are forgotten)."""
        ...

    def promote(self, branch_slot: int, parent_slot: int, fork_position: int, length: int) -> None:
        """Copy the branch's first `length` own positions into the parent at the fork."""
        ...


def supports_forks(model: CausalLM) -> bool:
    return bool(getattr(model, "supports_forks", False))
