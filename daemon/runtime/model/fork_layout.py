"""Index work for a forward pass with fork rows, done once per pass and shared by every layer.

Rows are regrouped by the main slot whose cache they read: a plain row reads its own slot, a
fork row its parent's. Each group is one attention problem: its members' queries ([R * T]
rows) against the slot's context, read once (a view when the groups' slots are consecutive),
followed by every member's branch cache. The mask lets a member see the parent positions below
its fork position (all positions up to its own, for a plain row) and its own branch positions
only. So a sequence with many branches reads its context once, and no context is copied into
any branch.
"""

from dataclasses import dataclass, field

import torch

from daemon.runtime.model.batch import NO_FORK, ForwardBatch

EMPTY_MEMBER_FORK = 1  # an unused (group, member) place sees key 0 only (keeps softmax finite)


@dataclass(slots=True)
class ForkLayout:
    num_groups: int  # U: distinct main slots read
    group_size: int  # R: most rows reading one slot
    member_index: torch.Tensor  # [B] g * R + r: where each row sits among the groups
    group_slots: torch.Tensor  # [U] the main slot each group reads
    group_slot_range: tuple[int, int] | None  # (first, last + 1) when group slots are consecutive
    branch_slots: torch.Tensor  # [U * R] branch slot each member reads (0 where unused)
    branch_len: int  # Lb: branch positions read per member
    branch_write_rows: torch.Tensor  # [N'] batch row of each token a fork row writes
    branch_write_cols: torch.Tensor  # [N']
    branch_write_slots: torch.Tensor  # [N'] branch slot
    branch_write_index: torch.Tensor  # [N'] position within the branch (absolute - fork)
    positions: torch.Tensor  # [U, R, T] query positions per member (0 where unused)
    fork_positions: torch.Tensor  # [U, R] main positions below this are visible
    is_fork: torch.Tensor  # [U, R] bool
    context_len: int  # L: main cache positions read
    _masks: dict[int | None, torch.Tensor] = field(default_factory=dict)

    def mask(self, window: int | None) -> torch.Tensor:
        """Bool mask [U, 1, R * T, L + R * Lb], cached per sliding window."""
        if window not in self._masks:
            self._masks[window] = self._build_mask(window)
        return self._masks[window]

    def _build_mask(self, window: int | None) -> torch.Tensor:
        groups, size, chunk = self.positions.shape
        device = self.positions.device
        query = self.positions.unsqueeze(-1)  # [U, R, T, 1]
        keys = torch.arange(self.context_len, device=device)  # [L]
        # [U, R, T, L] parent (or own) context: causal and below the fork position
        main = (keys <= query) & (keys < self.fork_positions[:, :, None, None])
        # [U, R, 1, Lb] absolute position of each branch entry of the member's own branch
        branch_pos = self.fork_positions[:, :, None, None] + torch.arange(
            self.branch_len, device=device
        )
        own = (branch_pos <= query) & self.is_fork[:, :, None, None]  # [U, R, T, Lb]
        if window is not None:
            main &= keys > query - window
            own &= branch_pos > query - window
        # [U, R, T, R', Lb] a member sees only its own branch (r' == r)
        same = torch.eye(size, dtype=torch.bool, device=device)[None, :, None, :, None]
        branch = own.unsqueeze(3) & same
        rows = size * chunk
        return torch.cat(
            (main.reshape(groups, rows, -1), branch.reshape(groups, rows, -1)), dim=-1
        ).unsqueeze(1)


def build_fork_layout(
    batch: ForwardBatch,
    positions: torch.Tensor,  # [B, T] absolute query positions (pads repeat the last)
    lengths: torch.Tensor,  # [B] chunk lengths
    device: torch.device,
) -> ForkLayout:
    assert batch.fork_parents is not None and batch.fork_positions is not None
    num_rows, chunk = positions.shape
    slots = torch.tensor(batch.slots)  # [B]
    parents = torch.tensor(batch.fork_parents)  # [B]
    forks = torch.tensor(batch.fork_positions)  # [B]
    is_fork = parents != NO_FORK  # [B]
    ends = torch.tensor(batch.start_positions) + lengths  # [B]
    # [B] the main slot each row reads; groups = distinct read slots, in slot order
    group_slots, group = torch.unique(torch.where(is_fork, parents, slots), return_inverse=True)
    num_groups = int(group_slots.shape[0])
    sizes = torch.bincount(group, minlength=num_groups)  # [U]
    size = int(sizes.max())
    # [B] rank of each row within its group (rows keep their batch order)
    order = torch.argsort(group, stable=True)
    firsts = torch.cumsum(sizes, 0) - sizes  # [U]
    rank = torch.empty_like(group)
    rank[order] = torch.arange(num_rows) - firsts[group[order]]
    member = group * size + rank  # [B]
    # main positions a member sees: below its fork, or all its own (plain rows)
    limit = torch.where(is_fork, forks, ends)  # [B]
    grouped_pos = torch.zeros((num_groups * size, chunk), dtype=torch.long)
    grouped_pos[member] = positions
    fork_pos = torch.full((num_groups * size,), EMPTY_MEMBER_FORK, dtype=torch.long)
    fork_pos[member] = limit
    grouped_fork = torch.zeros(num_groups * size, dtype=torch.bool)
    grouped_fork[member] = is_fork
    branch_slots = torch.zeros(num_groups * size, dtype=torch.long)
    branch_slots[member] = torch.where(is_fork, slots, 0)
    own = torch.where(is_fork, ends - forks, 1)  # [B] branch positions each row reads
    cols = torch.arange(chunk)
    # [N'] every real token of a fork row
    rows_w, cols_w = ((cols[None, :] < lengths[:, None]) & is_fork[:, None]).nonzero(as_tuple=True)
    first = int(group_slots[0])
    consecutive = bool((group_slots == torch.arange(first, first + num_groups)).all())
    tensors = {
        "member_index": member,
        "group_slots": group_slots,
        "branch_slots": branch_slots,
        "branch_write_rows": rows_w,
        "branch_write_cols": cols_w,
        "branch_write_slots": slots[rows_w],
        "branch_write_index": positions[rows_w, cols_w] - forks[rows_w],
        "positions": grouped_pos.view(num_groups, size, chunk),
        "fork_positions": fork_pos.view(num_groups, size),
        "is_fork": grouped_fork.view(num_groups, size),
    }
    return ForkLayout(
        num_groups=num_groups,
        group_size=size,
        group_slot_range=(first, first + num_groups) if consecutive else None,
        branch_len=int(own.max()),
        context_len=int(limit.max()),
        **{name: t.to(device, non_blocking=True) for name, t in tensors.items()},
    )
