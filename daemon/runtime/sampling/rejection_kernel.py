"""The rejection sampler as one Triton kernel: one program per sequence, a loop over draft
positions, the vocabulary in blocks. Same math and same rules as `rejection.py` (first index
wins an argmax; the emitted token by the two-level float64 inverse CDF of `inverse_cdf.py`),
so both return the same tokens from the same inputs (up to float64 rounding of the CDF).

Importing this module imports triton; `rejection_triton.py` guards that import.
"""

import triton
import triton.language as tl


@triton.jit
def _row_argmax(row_ptr, V, BLOCK_V: tl.constexpr):
    """argmax of row[0:V], first index on ties (torch.argmax's rule)."""
    best_val = tl.full((), float("-inf"), tl.float32)
    best_idx = tl.full((), 0, tl.int64)
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        vals = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf"))
        val, idx = tl.max(vals, axis=0, return_indices=True, return_indices_tie_break_left=True)
        is_better = val > best_val  # strict: an earlier block keeps a tie
        best_idx = tl.where(is_better, v0 + idx.to(tl.int64), best_idx)
        best_val = tl.where(is_better, val, best_val)
    return best_idx


@triton.jit
def _sparse_at(ids_ptr, probs_ptr, S, is_valid, BLOCK_S: tl.constexpr):
    """One position's sparse proposal (without a tail: proposals with one go to the torch
    reference): ids, probs [BLOCK_S] and whether probs are all zero (the point-mass
    convention). Nothing is read unless is_valid."""
    offs = tl.arange(0, BLOCK_S)
    mask = offs < tl.where(is_valid, S, 0)
    ids = tl.load(ids_ptr + offs, mask=mask, other=-1)
    probs = tl.load(probs_ptr + offs, mask=mask, other=0.0)
    num_nonzero = tl.sum((probs != 0.0).to(tl.int32), axis=0)
    return ids, probs, num_nonzero == 0


@triton.jit
def _residual_block(
    p_ptr, v0, V, ids, probs, point_id, point_weight, use_q,
    BLOCK_V: tl.constexpr, HAS_SPARSE: tl.constexpr,
):  # fmt: skip
    """max(0, p - q) [BLOCK_V] float64 over entries v0 .. v0 + BLOCK_V (0 past V).
    q = sparse (ids, probs) + point_weight * onehot(point_id), or 0 where not use_q."""
    offs = v0 + tl.arange(0, BLOCK_V)
    in_vocab = offs < V
    p = tl.load(p_ptr + offs, mask=in_vocab, other=0.0)
    q = tl.where(offs == point_id, point_weight, 0.0)
    if HAS_SPARSE:
        # [BLOCK_V, BLOCK_S] -> [BLOCK_V]: q_v = the prob listed under id v, else 0
        hit = (offs[:, None] == ids[None, :]) & (probs[None, :] > 0.0)
        q += tl.sum(tl.where(hit, probs[None, :], 0.0), axis=1)
    q = tl.where(use_q, q, 0.0)
    return tl.where(in_vocab, tl.maximum(p - q, 0.0), 0.0).to(tl.float64)


@triton.jit
def _inverse_cdf(
    p_ptr, u, V, ids, probs, point_id, point_weight, use_q,
    BLOCK_V: tl.constexpr, HAS_SPARSE: tl.constexpr,
):  # fmt: skip
    """The entry of max(0, p - q) whose float64 CDF range holds u * total (inverse_cdf.py's
    rule, blocks of BLOCK_V), and the total (0: nothing to sample)."""
    total = tl.full((), 0.0, tl.float64)
    last_positive = tl.full((), 0, tl.int64)
    for v0 in range(0, V, BLOCK_V):
        r = _residual_block(
            p_ptr, v0, V, ids, probs, point_id, point_weight, use_q, BLOCK_V, HAS_SPARSE,
        )  # fmt: skip
        total += tl.sum(r, axis=0)
        idx = tl.max(tl.where(r > 0.0, tl.arange(0, BLOCK_V), -1), axis=0)
        last_positive = tl.where(idx >= 0, v0 + idx.to(tl.int64), last_positive)
    point = u * total
    running = tl.full((), 0.0, tl.float64)
    token = tl.full((), -1, tl.int64)
    for v0 in range(0, V, BLOCK_V):
        r = _residual_block(
            p_ptr, v0, V, ids, probs, point_id, point_weight, use_q, BLOCK_V, HAS_SPARSE,
        )  # fmt: skip
        block_sum = tl.sum(r, axis=0)
        if (token < 0) & (running + block_sum > point):
            ends = running + tl.cumsum(r, axis=0)  # [BLOCK_V]
            local = tl.sum((ends <= point).to(tl.int64), axis=0)
            # rounding between the block's sum and its prefix: its last positive entry
            block_last = tl.max(tl.where(r > 0.0, tl.arange(0, BLOCK_V), -1), axis=0)
            local = tl.where(local >= BLOCK_V, block_last.to(tl.int64), local)
            token = v0 + local
        running += block_sum
    token = tl.where(token < 0, last_positive, token)
    return token, total


@triton.jit
def _accepts(
    draft, target_row_ptr, sparse_ids_ptr, sparse_probs_ptr, u, is_greedy,
    V, S, BLOCK_V: tl.constexpr, BLOCK_S: tl.constexpr, HAS_SPARSE: tl.constexpr,
):  # fmt: skip
    """Greedy: draft == argmax p. Sampled: u * q(x) < p(x), i.e. accept w.p. min(1, p/q)."""
    if is_greedy:
        accepted = draft == _row_argmax(target_row_ptr, V, BLOCK_V)
    else:
        p_x = tl.load(target_row_ptr + draft)
        q_x = 1.0  # point mass
        if HAS_SPARSE:
            ids, probs, is_point = _sparse_at(sparse_ids_ptr, sparse_probs_ptr, S, True, BLOCK_S)
            hit = (ids == draft) & (probs > 0.0)
            listed = tl.sum(tl.where(hit, probs, 0.0), axis=0)
            q_x = tl.where(is_point, 1.0, listed)
        accepted = u * q_x < p_x
    return accepted


@triton.jit
def rejection_kernel(
    out_ptr,  # [B, K+1] int64
    num_out_ptr,  # [B] int64
    draft_ptr,  # [B, K] int64
    num_draft_ptr,  # [B] int64
    sparse_ids_ptr,  # [B, K, S] int64 (unused without HAS_SPARSE)
    sparse_probs_ptr,  # [B, K, S] float32
    target_ptr,  # [B, K+1, V] float32
    greedy_ptr,  # [B] int8
    uniform_ptr,  # [B, K] float32
    emit_uniform_ptr,  # [B] float64
    K, V, S,
    HAS_SPARSE: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_OUT: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)
    num_draft = tl.load(num_draft_ptr + seq)
    is_greedy = tl.load(greedy_ptr + seq) != 0
    # accept the longest prefix of drafts: loop on, but stop testing after a rejection
    num_accepted = tl.full((), 0, tl.int64)
    for j in range(0, K):
        if (num_accepted == j) & (j < num_draft):
            pos = seq * K + j
            accepted = _accepts(
                tl.load(draft_ptr + pos), target_ptr + (seq * (K + 1) + j) * V,
                sparse_ids_ptr + pos * S, sparse_probs_ptr + pos * S, tl.load(uniform_ptr + pos),
                is_greedy, V, S, BLOCK_V, BLOCK_S, HAS_SPARSE,
            )  # fmt: skip
            num_accepted += accepted.to(tl.int64)
    token = _emit(
        draft_ptr, sparse_ids_ptr, sparse_probs_ptr, target_ptr, emit_uniform_ptr, seq,
        num_accepted, num_draft, is_greedy, K, V, S, BLOCK_V, BLOCK_S, HAS_SPARSE,
    )  # fmt: skip
    # [BLOCK_OUT] accepted drafts, then the emitted token, then PLACEHOLDER (-1)
    offs = tl.arange(0, BLOCK_OUT)
    drafts = tl.load(draft_ptr + seq * K + offs, mask=offs < num_accepted, other=-1)
    row = tl.where(offs == num_accepted, token, drafts)
    tl.store(out_ptr + seq * (K + 1) + offs, row, mask=offs < K + 1)
    tl.store(num_out_ptr + seq, num_accepted + 1)


@triton.jit
def _emit(
    draft_ptr, sparse_ids_ptr, sparse_probs_ptr, target_ptr, emit_uniform_ptr, seq, pos,
    num_draft, is_greedy, K, V, S,
    BLOCK_V: tl.constexpr, BLOCK_S: tl.constexpr, HAS_SPARSE: tl.constexpr,
):  # fmt: skip
    """The token at position `pos`: correction from norm(max(0, p - q)) after a rejection,
    bonus from p (q = 0) when pos == num_draft, argmax p for greedy rows."""
    p_ptr = target_ptr + (seq * (K + 1) + pos) * V
    if is_greedy:
        token = _row_argmax(p_ptr, V, BLOCK_V)
    else:
        u = tl.load(emit_uniform_ptr + seq)
        has_draft = pos < num_draft
        draft_at = seq * K + tl.minimum(pos, K - 1)
        point_id = tl.load(draft_ptr + draft_at, mask=has_draft, other=-1)
        point_weight = 1.0
        ids = tl.full((BLOCK_S,), -1, tl.int64)
        probs = tl.zeros((BLOCK_S,), tl.float32)
        if HAS_SPARSE:
            ids, probs, is_point = _sparse_at(
                sparse_ids_ptr + draft_at * S, sparse_probs_ptr + draft_at * S, S, has_draft,
                BLOCK_S,
            )  # fmt: skip
            point_weight = tl.where(is_point, 1.0, 0.0)
        token, total = _inverse_cdf(
            p_ptr, u, V, ids, probs, point_id, point_weight, has_draft, BLOCK_V, HAS_SPARSE,
        )  # fmt: skip
        if total == 0.0:  # p == q: fall back to p
            token, total = _inverse_cdf(
                p_ptr, u, V, ids, probs, point_id, point_weight, pos < 0, BLOCK_V, HAS_SPARSE,
            )  # fmt: skip
    return token
