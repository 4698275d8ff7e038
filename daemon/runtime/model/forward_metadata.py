"""One forward pass's index tensors: the ragged batch padded to [B, T_max], positions, masks.

Built once per pass and shared by every layer, so no layer redoes padding or mask work.
"""

from dataclasses import dataclass, field

import torch

from daemon.runtime.errors import RequestError
from daemon.runtime.model import native
from daemon.runtime.model.batch import ForwardBatch
from daemon.runtime.model.fork_layout import ForkLayout, build_fork_layout

PAD_TOKEN_ID = 0  # fills chunks shorter than T_max; its K/V are never written, its logits unused
# Attention reads the KV cache of the slot span [min slot, max slot + 1) as one view when the
# span holds at most this many slots per batch row; the span's idle slots are computed and
# dropped. Beyond it, the batch's slots are gathered (a copy of every layer's K/V, which on a
# CPU costs about three times the attention that reads them).
MAX_SPAN_PER_ROW = 4
NATIVE_MAX_CHUNK = 16  # chunks up to this run the native attention on a CPU; a prefill: sdpa


@dataclass(slots=True)
class ForwardMetadata:
    token_ids: torch.Tensor  # [B, T] padded with PAD_TOKEN_ID
    positions: torch.Tensor  # [B, T] absolute; a pad repeats its chunk's last real position
    last_index: torch.Tensor  # [B] index in T of each chunk's last real token
    slots: torch.Tensor  # [B]
    write_rows: torch.Tensor  # [N] batch row of each real token
    write_cols: torch.Tensor  # [N] column (t) of each real token
    write_slots: torch.Tensor  # [N]
    write_positions: torch.Tensor  # [N]
    context_len: int  # L = max(start + T_b): cache positions the batch attends to
    # (first, stop): attention reads slots first..stop-1 of the cache as a view (R = stop -
    # first rows); None: it gathers the batch's slots (R = B)
    slot_span: tuple[int, int] | None
    # [B] each batch row's row in the span; None when the span is the batch in order
    span_rows: torch.Tensor | None
    fork: ForkLayout | None = None  # batches with fork rows: writes above are plain rows only
    # every query sees every key 0..L-1 (a decode step whose rows all end at L - 1, with no
    # idle span row): no mask unless a sliding window is shorter than L
    sees_all: bool = False
    # how the real tokens' K/V reach the cache (KVCache.write): (slot, start) of a batch of one
    # plain row (its chunk is positions start..start+T-1 of that slot: one slice copy); else
    # `writes_grid` when every [B, T] cell is a real token of a plain row (no gather of them)
    single_row: tuple[int, int] | None = None
    writes_grid: bool = False
    # every row starts at position 0 (a prefill): query t sees keys 0..t, the kernel's own
    # causal mode (no [R, 1, G * T, L] mask, which grows as T^2; masked blocks skipped)
    from_zero: bool = False
    # [B, 3] int64 (slot, start position, chunk length) per row, for the native decode
    # attention (a CPU pass of chunks up to NATIVE_MAX_CHUNK without fork rows); else None
    native_rows: torch.Tensor | None = None
    # the rotary tables (cos, signed sin) [max_len, D] the native attention reads; set by the
    # model beside native_rows
    rope_tables: tuple[torch.Tensor, torch.Tensor] | None = None
    _masks: dict[tuple[int | None, int, torch.dtype], torch.Tensor] = field(default_factory=dict)

    def mask(
        self, window: int | None, group: int = 1, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor | None:
        """Additive attention mask [R, 1, G * T, L] in `dtype` (0 where visible, -inf where
        not) over the attended rows, for queries of `group` (G) heads stacked along the query
        axis (head-major): key l is visible to a query at position p iff l <= p (and
        p - l < window with a sliding window); an idle span row sees key 0 only (its output
        is dropped; a row that sees nothing would be NaN). Built once per pass and cached per
        window, group and dtype: a bool mask would be converted to this form again by every
        layer's attention (~30 us a layer at 16 rows of 5 tokens on a CPU). None where every
        key is visible to every query (`sees_all`): the kernel then reads no mask."""
        if self.sees_all and (window is None or window >= self.context_len):
            return None
        key = (window, group, dtype)
        if key not in self._masks:
            # [L]
            key_pos = torch.arange(self.context_len, device=self.positions.device)
            # [R, T, 1]
            query_pos = self.to_span(self.positions).unsqueeze(-1)
            # [R, T, L]
            visible = key_pos <= query_pos
            if window is not None:
                visible &= key_pos > query_pos - window
            rows, chunk, length = visible.shape
            # [R, 1, G * T, L]
            visible = (
                visible.unsqueeze(1)
                .expand(rows, group, chunk, length)
                .reshape(rows, 1, group * chunk, length)
            )
            additive = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
            self._masks[key] = additive.masked_fill_(~visible, float("-inf"))
        return self._masks[key]

    def to_span(self, rows: torch.Tensor) -> torch.Tensor:
        """[B, ...] batch rows -> [R, ...] attended rows (zeros at idle span rows)."""
        if self.span_rows is None:
            return rows
        first, stop = self.slot_span  # type: ignore[misc]
        out = rows.new_zeros((stop - first, *rows.shape[1:]))
        out[self.span_rows] = rows
        return out

    def from_span(self, rows: torch.Tensor) -> torch.Tensor:
        """[R, ...] attended rows -> [B, ...] batch rows."""
        return rows if self.span_rows is None else rows[self.span_rows]


def check_batch(
    batch: ForwardBatch,
    *,
    num_slots: int,
    max_model_len: int,
    vocab_size: int,
    num_branch_slots: int = 0,
    branch_len: int = 0,
) -> None:
    """Raise RequestError for a slot, length or token id the runner cannot take."""
    fork_rows = set(batch.fork_rows)
    for row, (slot, chunk, start) in enumerate(
        zip(batch.slots, batch.token_ids, batch.start_positions, strict=True)
    ):
        if start < 0:
            raise RequestError(f"slot {slot}: start_position {start} is negative")
        if start + len(chunk) > max_model_len:
            raise RequestError(
                f"slot {slot}: {start} cached + {len(chunk)} new tokens exceed "
                f"max_model_len {max_model_len}"
            )
        if min(chunk) < 0 or max(chunk) >= vocab_size:
            raise RequestError(f"slot {slot}: token id out of range [0, {vocab_size})")
        if row not in fork_rows and not 0 <= slot < num_slots:
            raise RequestError(f"slot {slot} out of range: the runner has {num_slots} slots")
    for row in batch.fork_rows:
        _check_fork_row(batch, row, num_slots, num_branch_slots, branch_len)


def _check_fork_row(
    batch: ForwardBatch, row: int, num_slots: int, num_branch_slots: int, branch_len: int
) -> None:
    assert batch.fork_parents is not None and batch.fork_positions is not None
    if num_branch_slots == 0:
        raise RequestError("fork rows need a branch cache: this runner has none")
    branch, parent = batch.slots[row], batch.fork_parents[row]
    if not 0 <= branch < num_branch_slots:
        raise RequestError(
            f"branch slot {branch} out of range: the runner has {num_branch_slots} branch slots"
        )
    if not 0 <= parent < num_slots:
        raise RequestError(f"fork parent slot {parent} out of range: {num_slots} slots")
    own = batch.start_positions[row] + len(batch.token_ids[row]) - batch.fork_positions[row]
    if own > branch_len:
        raise RequestError(
            f"branch slot {branch}: {own} own positions exceed the branch length {branch_len}"
        )


def build_metadata(batch: ForwardBatch, device: torch.device) -> ForwardMetadata:
    """Pad the batch and compute every index tensor a pass needs (on CPU, then moved)."""
    max_len = batch.max_chunk_len
    padded = [chunk + [PAD_TOKEN_ID] * (max_len - len(chunk)) for chunk in batch.token_ids]
    # [B]
    lengths = torch.tensor([len(chunk) for chunk in batch.token_ids])
    starts = torch.tensor(batch.start_positions)
    slots = torch.tensor(batch.slots)
    # [T]
    cols = torch.arange(max_len)
    # [B, T]
    positions = starts[:, None] + torch.minimum(cols[None, :], (lengths - 1)[:, None])
    real = cols[None, :] < lengths[:, None]
    fork = None
    if batch.has_forks:
        fork = build_fork_layout(batch, positions, lengths, device)
        is_plain = torch.ones(batch.num_seqs, dtype=torch.bool)
        is_plain[batch.fork_rows] = False
        real &= is_plain[:, None]
    # [N] each: the real tokens written to the main cache
    rows, write_cols = real.nonzero(as_tuple=True)
    slot_span, span_rows = None, None
    if fork is None:
        first, stop = min(batch.slots), max(batch.slots) + 1
        if stop - first <= MAX_SPAN_PER_ROW * batch.num_seqs:
            slot_span = (first, stop)
            if batch.slots != list(range(first, stop)):
                span_rows = (slots - first).to(device, non_blocking=True)
    tensors = {
        "token_ids": torch.tensor(padded),
        "positions": positions,
        "last_index": lengths - 1,
        "slots": slots,
        "write_rows": rows,
        "write_cols": write_cols,
        "write_slots": slots[rows],
        "write_positions": positions[rows, write_cols],
    }
    context_len = int((starts + lengths).max())
    sees_all = (
        fork is None
        and max_len == 1
        and slot_span is not None
        and slot_span[1] - slot_span[0] == batch.num_seqs  # with distinct slots: no idle row
        and len(set(batch.slots)) == batch.num_seqs
        and all(start + 1 == context_len for start in batch.start_positions)
    )
    return ForwardMetadata(
        **{name: t.to(device, non_blocking=True) for name, t in tensors.items()},
        context_len=context_len,
        slot_span=slot_span,
        span_rows=span_rows,
        fork=fork,
        sees_all=sees_all,
        single_row=(
            (batch.slots[0], batch.start_positions[0])
            if fork is None and batch.num_seqs == 1
            else None
        ),
        writes_grid=fork is None and all(len(c) == max_len for c in batch.token_ids),
        from_zero=fork is None and not any(batch.start_positions),
        native_rows=(
            torch.tensor(
                [
                    [slot, start, len(chunk)]
                    for slot, start, chunk in zip(
                        batch.slots, batch.start_positions, batch.token_ids, strict=True
                    )
                ],
                dtype=torch.int64,
            )
            if fork is None
            and device.type == "cpu"
            and max_len <= NATIVE_MAX_CHUNK
            and native.kernels() is not None  # built; a layer decides whether it uses it
            else None
        ),
    )


def static_metadata(
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor,
    last_index: torch.Tensor,
    *,
    context_len: int,
) -> ForwardMetadata:
    """A padded batch's metadata from device tensors alone, with no host work (what a
    captured CUDA graph replays; see static_pass.py): every row appends T tokens (padding
    included), the whole [B, T] grid is written, attention gathers the batch's slots over
    `context_len` positions.

    token_ids, positions [B, T]; slots, last_index [B]."""
    batch, chunk = token_ids.shape
    device = token_ids.device
    # [N = B * T] each
    rows = torch.arange(batch, device=device).repeat_interleave(chunk)
    cols = torch.arange(chunk, device=device).repeat(batch)
    return ForwardMetadata(
        token_ids=token_ids,
        positions=positions,
        last_index=last_index,
        slots=slots,
        write_rows=rows,
        write_cols=cols,
        write_slots=slots[rows],
        write_positions=positions.reshape(-1),
        context_len=context_len,
        slot_span=None,
        span_rows=None,
    )
