"""The one input every model runner takes: ragged chunks of tokens appended to KV-cache slots."""

from dataclasses import dataclass
from enum import Enum

import torch

NO_FORK = -1  # `ForwardBatch.fork_parents` entry of an ordinary row


class LogitsMode(Enum):
    """Which positions a forward pass must return logits for."""

    ALL = "all"  # every appended position: [B, T_max, V] (padded rows past T_b are garbage)
    LAST = "last"  # the last appended position of each sequence: [B, V]
    NONE = "none"  # fill the KV cache only (draft prefill): returns None


@dataclass(slots=True)
class ForwardBatch:
    """Append `token_ids[b]` to the KV cache of `slots[b]`, after `start_positions[b]` tokens.

    `start_positions[b]` is the number of tokens of that slot's sequence to keep in the cache;
    anything cached beyond it is discarded (this is how a rejected draft is rolled back: by
    moving a length, never by copying). Token t of chunk b sits at absolute position
    `start_positions[b] + t` and attends to cache positions `0 .. start_positions[b] + t`.

    Fork rows (runners with `supports_forks`): where `fork_parents[b]` names a slot, row b is
    a branch of that parent sequence. `slots[b]` is then a *branch slot* (a small cache of the
    runner's holding only the branch's own tokens), and the row reads cache positions below
    `fork_positions[b]` from the parent slot, its own positions (from the fork position on)
    from the branch slot, and writes only there. A branch never copies its parent's context.
    """

    slots: list[int]  # [B] KV-cache slots (branch slots for fork rows)
    token_ids: list[list[int]]  # [B][T_b], every T_b >= 1
    start_positions: list[int]  # [B]
    logits_mode: LogitsMode = LogitsMode.ALL
    fork_parents: list[int] | None = None  # [B] parent slot of a fork row, NO_FORK otherwise
    fork_positions: list[int] | None = None  # [B] fork rows: first position the branch owns
    # chunks of prompts (engine/prefill.py): run eagerly, never at a static shape (a CUDA
    # graph per shape is for decode and verify passes; a prompt's chunks come in any shape)
    is_prefill: bool = False

    def __post_init__(self) -> None:
        num_seqs = len(self.slots)
        if len(self.token_ids) != num_seqs or len(self.start_positions) != num_seqs:
            raise ValueError("slots, token_ids and start_positions must have the same length")
        if any(len(chunk) == 0 for chunk in self.token_ids):
            raise ValueError("every chunk must append at least one token")
        if (self.fork_parents is None) != (self.fork_positions is None):
            raise ValueError("fork_parents and fork_positions go together")
        if self.fork_parents is not None and self.fork_positions is not None:
            if len(self.fork_parents) != num_seqs or len(self.fork_positions) != num_seqs:
                raise ValueError("fork_parents and fork_positions need one entry per row")
            for b in self.fork_rows:
                if not 0 <= self.fork_positions[b] <= self.start_positions[b]:
                    raise ValueError(
                        f"row {b}: fork position {self.fork_positions[b]} must be in "
                        f"[0, start position {self.start_positions[b]}]"
                    )
        for kind, rows in (("slot", self.plain_rows), ("branch slot", self.fork_rows)):
            used = [self.slots[b] for b in rows]
            if len(set(used)) != len(used):
                raise ValueError(f"a {kind} may appear only once per batch")

    @property
    def num_seqs(self) -> int:
        return len(self.slots)

    @property
    def max_chunk_len(self) -> int:
        return max((len(chunk) for chunk in self.token_ids), default=0)

    @property
    def has_forks(self) -> bool:
        return self.fork_parents is not None and any(p != NO_FORK for p in self.fork_parents)

    @property
    def fork_rows(self) -> list[int]:
        parents = self.fork_parents
        return [] if parents is None else [b for b, p in enumerate(parents) if p != NO_FORK]

    @property
    def plain_rows(self) -> list[int]:
        parents = self.fork_parents
        return (
            list(range(self.num_seqs))
            if parents is None
            else [b for b, p in enumerate(parents) if p == NO_FORK]
        )


# Padded prompt tokens per prefill pass when the caller names none. On a CPU a pass of a few
# hundred tokens keeps its activations in the last-level cache: 32 code prompts (4,612 tokens)
# through the narrow bench target prefill in 3.7-4.2 s in passes of 512 against 6.2-7.1 s in
# passes of 8192, where every layer's activations (tens of MB) are fresh allocations that
# page-fault each pass. A GPU wants large passes.
CPU_PREFILL_TOKENS = 512
GPU_PREFILL_TOKENS = 8192


def prefill_budget(requested: int | None, device: torch.device) -> int:
    """Padded tokens per prefill pass: `requested`, or the device's default."""
    if requested is not None:
        return requested
    return CPU_PREFILL_TOKENS if device.type == "cpu" else GPU_PREFILL_TOKENS


def group_by_length(lengths: list[int], max_padded_tokens: int) -> list[list[int]]:
    """Indices of `lengths` in groups of similar length (shortest first) whose padded size,
    group size x longest chunk, stays within `max_padded_tokens` (a longer chunk goes alone):
    prefilling prompts together wastes little compute on padding."""
    groups: list[list[int]] = []
    group: list[int] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if group and lengths[i] * (len(group) + 1) > max_padded_tokens:
            groups.append(group)
            group = []
        group.append(i)
    if group:
        groups.append(group)
    return groups
