"""Argument checks shared by the rejection sampler's torch reference and Triton kernel.

Bad shapes, dtypes or out-of-range ids raise ValueError before any index is used: on CUDA an
out-of-range id would be an illegal memory access inside the kernel instead.
"""

import torch


def check_rejection_inputs(
    draft_token_ids: torch.Tensor,  # [B, K]
    num_draft_tokens: torch.Tensor,  # [B]
    draft_sparse_ids: torch.Tensor | None,  # [B, K, S]
    draft_sparse_probs: torch.Tensor | None,  # [B, K, S]
    target_probs: torch.Tensor,  # [B, K+1, V]
    is_greedy: torch.Tensor,  # [B]
    uniform: torch.Tensor,  # [B, K]
    emit_uniform: torch.Tensor,  # [B] float64
    draft_sparse_tail: torch.Tensor | None = None,  # [B, K]
    position_keys: torch.Tensor | None = None,  # [B, K] int64
) -> None:
    if draft_token_ids.dim() != 2:
        raise ValueError(f"draft_token_ids must be [B, K], got {_shape(draft_token_ids)}")
    num_seqs, max_k = draft_token_ids.shape
    if target_probs.dim() != 3 or target_probs.shape[:2] != (num_seqs, max_k + 1):
        raise ValueError(
            f"target_probs must be [B={num_seqs}, K+1={max_k + 1}, V], got {_shape(target_probs)}"
        )
    vocab_size = target_probs.shape[-1]
    if vocab_size < 1:
        raise ValueError("target_probs has an empty vocabulary")
    _expect(num_draft_tokens, (num_seqs,), "num_draft_tokens", integer=True)
    _expect(is_greedy, (num_seqs,), "is_greedy")
    _expect(uniform, (num_seqs, max_k), "uniform")
    _expect(emit_uniform, (num_seqs,), "emit_uniform")
    if emit_uniform.dtype != torch.float64:
        raise ValueError(f"emit_uniform must be float64, got {emit_uniform.dtype}")
    if is_greedy.dtype != torch.bool:
        raise ValueError(f"is_greedy must be bool, got {is_greedy.dtype}")
    if draft_token_ids.dtype.is_floating_point:
        raise ValueError(f"draft_token_ids must be int64, got {draft_token_ids.dtype}")
    _check_sparse(draft_sparse_ids, draft_sparse_probs, num_seqs, max_k)
    if draft_sparse_tail is not None:
        if draft_sparse_ids is None:
            raise ValueError("draft_sparse_tail needs draft_sparse_ids and draft_sparse_probs")
        _expect(draft_sparse_tail, (num_seqs, max_k), "draft_sparse_tail")
    if position_keys is not None:
        _expect(position_keys, (num_seqs, max_k), "position_keys", integer=True)
    tensors = (draft_token_ids, num_draft_tokens, target_probs, is_greedy, uniform, emit_uniform)
    if draft_sparse_ids is not None and draft_sparse_probs is not None:
        tensors += (draft_sparse_ids, draft_sparse_probs)
    if draft_sparse_tail is not None:
        tensors += (draft_sparse_tail,)
    if position_keys is not None:
        tensors += (position_keys,)
    devices = sorted({str(t.device) for t in tensors})
    if len(devices) > 1:
        raise ValueError(f"inputs are on several devices: {devices}")
    _check_values(draft_token_ids, num_draft_tokens, draft_sparse_ids, vocab_size)


def _check_sparse(
    ids: torch.Tensor | None, probs: torch.Tensor | None, num_seqs: int, max_k: int
) -> None:
    if (ids is None) != (probs is None):
        raise ValueError("draft_sparse_ids and draft_sparse_probs must both be given or both None")
    if ids is None or probs is None:
        return
    if ids.dim() != 3 or ids.shape[:2] != (num_seqs, max_k) or ids.shape != probs.shape:
        raise ValueError(
            f"draft_sparse_ids/probs must both be [B={num_seqs}, K={max_k}, S], "
            f"got {_shape(ids)} and {_shape(probs)}"
        )
    if ids.dtype.is_floating_point:
        raise ValueError(f"draft_sparse_ids must be int64, got {ids.dtype}")


def _check_values(
    draft_token_ids: torch.Tensor,  # [B, K]
    num_draft_tokens: torch.Tensor,  # [B]
    sparse_ids: torch.Tensor | None,  # [B, K, S]
    vocab_size: int,
) -> None:
    """One host sync for all value checks (on a CPU, a few reads instead: the ops that batch
    them into one sync cost ~0.1 ms a verify pass there)."""
    max_k = draft_token_ids.shape[1]
    if draft_token_ids.device.type == "cpu":
        bad = _bad_values_on_host(draft_token_ids, num_draft_tokens, sparse_ids, vocab_size)
    else:
        # [B, K]
        is_real = torch.arange(max_k, device=draft_token_ids.device) < num_draft_tokens.unsqueeze(
            -1
        )
        bad_draft = is_real & ((draft_token_ids < 0) | (draft_token_ids >= vocab_size))
        bad = torch.stack(
            [
                ((num_draft_tokens < 0) | (num_draft_tokens > max_k)).any(),
                bad_draft.any(),
                torch.zeros((), dtype=torch.bool, device=draft_token_ids.device)
                if sparse_ids is None
                else ((sparse_ids < 0) | (sparse_ids >= vocab_size)).any(),
            ]
        ).tolist()
    if bad[0]:
        raise ValueError(f"num_draft_tokens must be in [0, K={max_k}]")
    if bad[1]:
        raise ValueError(f"draft_token_ids must be in [0, V={vocab_size}) below num_draft_tokens")
    if bad[2]:
        raise ValueError(f"draft_sparse_ids must be in [0, V={vocab_size})")


def _bad_values_on_host(
    draft_token_ids: torch.Tensor,  # [B, K]
    num_draft_tokens: torch.Tensor,  # [B]
    sparse_ids: torch.Tensor | None,  # [B, K, S]
    vocab_size: int,
) -> list[bool]:
    """_check_values' three tests (counts, drafts, listed ids) on CPU tensors: lists and one
    min-max op, no batch of tensor ops."""
    max_k = draft_token_ids.shape[1]
    counts = num_draft_tokens.tolist()
    if any(not 0 <= n <= max_k for n in counts):
        return [True, False, False]  # (the drafts' test reads the counts)
    rows = draft_token_ids.tolist()
    bad_drafts = any(
        not 0 <= t < vocab_size for row, n in zip(rows, counts, strict=True) for t in row[:n]
    )
    bad_ids = False
    if sparse_ids is not None and sparse_ids.numel():
        low, high = torch.aminmax(sparse_ids)
        bad_ids = int(low) < 0 or int(high) >= vocab_size
    return [False, bad_drafts, bad_ids]


def _expect(t: torch.Tensor, shape: tuple[int, ...], name: str, integer: bool = False) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {_shape(t)}")
    if integer and t.dtype.is_floating_point:
        raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)
