"""Static per-slot KV cache: preallocated once, rolled back by moving a length (never copied).

Optionally a branch cache beside it: a few positions per branch slot, holding only a fork
row's own tokens (its context stays in the parent slot; see fork_layout.py).
"""

import torch

from daemon.runtime.errors import RequestError
from daemon.runtime.model.fork_layout import ForkLayout
from daemon.runtime.model.forward_metadata import ForwardMetadata
from daemon.runtime.model.memory_guard import GIB, allocated, require_room


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
        weights_bytes: int = 0,
    ) -> None:
        """`weights_bytes`: the model's weights, still to be read after the cache: the room
        checked is for both."""
        shape = (num_slots, num_kv_heads, max_model_len, head_dim)
        per_layer = num_slots * num_kv_heads * max_model_len * head_dim * dtype.itemsize
        kv_bytes = 2 * num_layers * per_layer
        what = (
            f"the KV cache ({num_slots} slots x {max_model_len} positions x {num_layers} layers, "
            f"{str(dtype).removeprefix('torch.')})"
        )
        advice = "lower max_batch_size or max_model_len"
        if weights_bytes:
            what = f"the weights ({weights_bytes / GIB:.2f} GiB) with {what[:-1]}: "
            what += f"{kv_bytes / GIB:.2f} GiB)"
            advice += ", or spread the model over more nodes"
        require_room(kv_bytes + weights_bytes, torch.device(device), what, advice)
        # num_layers x [S, H_kv, M, D]
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        allocated(torch.device(device), kv_bytes)  # zero-filled: in use, the free memory says
        # num_layers x [S_branch, H_kv, branch_len, D]; empty until enable_branches
        self.branch_keys: list[torch.Tensor] = []
        self.branch_values: list[torch.Tensor] = []

    @property
    def num_branch_slots(self) -> int:
        return int(self.branch_keys[0].shape[0]) if self.branch_keys else 0

    @property
    def branch_len(self) -> int:
        return int(self.branch_keys[0].shape[2]) if self.branch_keys else 0

    def enable_branches(self, num_branch_slots: int, branch_len: int) -> None:
        """Allocate (or reallocate) the branch cache; existing branches are forgotten."""
        if num_branch_slots < 1 or branch_len < 1:
            raise RequestError(
                f"need >= 1 branch slot and branch length, got {num_branch_slots}, {branch_len}"
            )
        _, heads, _, dim = self.keys[0].shape
        shape = (num_branch_slots, heads, branch_len, dim)
        like = self.keys[0]
        self.branch_keys = [like.new_zeros(shape) for _ in self.keys]
        self.branch_values = [like.new_zeros(shape) for _ in self.keys]

    def write(self, layer: int, meta: ForwardMetadata, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the K/V [B, T, H_kv, D] of the batch's real (non-pad) tokens at their positions
        (fork rows' tokens go to their branch slots)."""
        if meta.single_row is not None:
            slot, start = meta.single_row
            stop = start + k.shape[1]
            # [H_kv, T, D]: one slice copy where the scatter below costs ~3x (a decode step)
            self.keys[layer][slot, :, start:stop] = k[0].transpose(0, 1)
            self.values[layer][slot, :, start:stop] = v[0].transpose(0, 1)
            return
        if meta.writes_grid:
            # [N = B * T, H_kv, D]: every cell is real, in the order of write_slots/positions
            k_real = k.reshape(-1, *k.shape[2:])
            v_real = v.reshape(-1, *v.shape[2:])
        else:
            # [N, H_kv, D] (N = real tokens of plain rows)
            k_real = k[meta.write_rows, meta.write_cols]
            v_real = v[meta.write_rows, meta.write_cols]
        self.keys[layer][meta.write_slots, :, meta.write_positions] = k_real
        self.values[layer][meta.write_slots, :, meta.write_positions] = v_real
        fork = meta.fork
        if fork is not None:
            rows, cols = fork.branch_write_rows, fork.branch_write_cols
            slots, index = fork.branch_write_slots, fork.branch_write_index
            self.branch_keys[layer][slots, :, index] = k[rows, cols]
            self.branch_values[layer][slots, :, index] = v[rows, cols]

    def read(self, layer: int, meta: ForwardMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V for positions 0..L-1 of the attended rows (meta.slot_span): each
        [R, H_kv, L, D], a view of the span's slots, or a copy of the batch's slots (R = B)."""
        length = meta.context_len
        if meta.slot_span is not None:
            start, stop = meta.slot_span
            return (
                self.keys[layer][start:stop, :, :length],
                self.values[layer][start:stop, :, :length],
            )
        return self.keys[layer][meta.slots, :, :length], self.values[layer][meta.slots, :, :length]

    def read_grouped(self, layer: int, meta: ForwardMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """Fork batches: per group, its slot's context then every member's branch positions:
        K and V each [U, H_kv, L + R * Lb, D]."""
        fork = meta.fork
        assert fork is not None
        return (
            self._grouped(self.keys[layer], self.branch_keys[layer], fork),
            self._grouped(self.values[layer], self.branch_values[layer], fork),
        )

    @staticmethod
    def _grouped(main: torch.Tensor, branches: torch.Tensor, fork: ForkLayout) -> torch.Tensor:
        length, branch_len = fork.context_len, fork.branch_len
        if fork.group_slot_range is not None:
            start, stop = fork.group_slot_range
            context = main[start:stop, :, :length]  # [U, H_kv, L, D] a view
        else:
            context = main[fork.group_slots, :, :length]
        groups, size = fork.num_groups, fork.group_size
        # [U * R, H_kv, Lb, D] -> [U, H_kv, R * Lb, D]
        own = branches[fork.branch_slots, :, :branch_len]
        heads, dim = own.shape[1], own.shape[3]
        own = own.view(groups, size, heads, branch_len, dim).transpose(1, 2)
        return torch.cat((context, own.reshape(groups, heads, size * branch_len, dim)), dim=2)

    def promote(self, branch_slot: int, parent_slot: int, fork_position: int, length: int) -> None:
        """Copy a branch's first `length` own positions into its parent slot at the fork
        position (the branch won: the parent continues as the branch did)."""
        if not 0 <= branch_slot < self.num_branch_slots:
            raise RequestError(
                f"branch slot {branch_slot} out of range: {self.num_branch_slots} branch slots"
            )
        if not 0 <= length <= self.branch_len:
            raise RequestError(f"promote length {length} outside [0, {self.branch_len}]")
        if not 0 <= parent_slot < self.keys[0].shape[0]:
            raise RequestError(f"parent slot {parent_slot} out of range")
        end = fork_position + length
        if fork_position < 0 or end > self.keys[0].shape[2]:
            raise RequestError(f"promote to positions [{fork_position}, {end}) out of range")
        for layer in range(len(self.keys)):
            own_k = self.branch_keys[layer][branch_slot, :, :length]
            own_v = self.branch_values[layer][branch_slot, :, :length]
            self.keys[layer][parent_slot, :, fork_position:end] = own_k
            self.values[layer][parent_slot, :, fork_position:end] = own_v
