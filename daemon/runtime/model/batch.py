"""The one input every model runner takes: ragged chunks of tokens appended to KV-cache slots."""

from dataclasses import dataclass
from enum import Enum


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
    """

    slots: list[int]  # [B]
    token_ids: list[list[int]]  # [B][T_b], every T_b >= 1
    start_positions: list[int]  # [B]
    logits_mode: LogitsMode = LogitsMode.ALL

    def __post_init__(self) -> None:
        num_seqs = len(self.slots)
        if len(self.token_ids) != num_seqs or len(self.start_positions) != num_seqs:
            raise ValueError("slots, token_ids and start_positions must have the same length")
        if any(len(chunk) == 0 for chunk in self.token_ids):
            raise ValueError("every chunk must append at least one token")
        if len(set(self.slots)) != num_seqs:
            raise ValueError("a slot may appear only once per batch")

    @property
    def num_seqs(self) -> int:
        return len(self.slots)

    @property
    def max_chunk_len(self) -> int:
        return max((len(chunk) for chunk in self.token_ids), default=0)


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
