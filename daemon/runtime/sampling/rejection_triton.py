"""Launching the Triton rejection sampler, and the dispatch the engine calls.

`dispatch.rejection_sample_for_device` runs this kernel for CUDA tensors when triton
imports, else the torch reference; both return identical outputs from identical inputs (see
`rejection.py` for the math and the proposal convention). On CPU the kernel runs only under
TRITON_INTERPRET=1, which must be set before this module is first imported (triton reads it
when the kernel is decorated); tests do that in a subprocess.
"""

import torch

from daemon.runtime.sampling.checks import check_rejection_inputs

try:
    import triton

    from daemon.runtime.sampling.rejection_kernel import rejection_kernel

    HAS_TRITON = True
except ImportError:  # triton is optional off Linux/CUDA
    HAS_TRITON = False

# vocab block x sparse width bounded, so the [BLOCK_V, BLOCK_S] compare fits in registers
MAX_BLOCK_V = 1024
MAX_BLOCK_ELEMENTS = 16384


def rejection_sample_triton(
    draft_token_ids: torch.Tensor,  # [B, K] int64
    num_draft_tokens: torch.Tensor,  # [B] int64
    draft_sparse_ids: torch.Tensor | None,  # [B, K, S] int64
    draft_sparse_probs: torch.Tensor | None,  # [B, K, S] float32
    target_probs: torch.Tensor,  # [B, K+1, V] float32
    is_greedy: torch.Tensor,  # [B] bool
    uniform: torch.Tensor,  # [B, K] float32
    emit_uniform: torch.Tensor,  # [B] float64
    draft_sparse_tail: torch.Tensor | None = None,  # [B, K] float32, all zero
    position_keys: torch.Tensor | None = None,  # [B, K] int64: unused without a tail
    max_block_v: int = MAX_BLOCK_V,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel; same contract as `rejection.rejection_sample` for proposals without a tail
    (an unlisted draft's coupled token is the reference's: `rejection_sample_for_device`
    routes tails there). `max_block_v` (a power of two) caps the vocabulary block; tests
    lower it to run several blocks on a small vocab."""
    if not HAS_TRITON:
        raise RuntimeError("triton is not installed; use rejection_sample_for_device")
    if draft_sparse_tail is not None and bool((draft_sparse_tail != 0).any()):
        raise ValueError(
            "the Triton rejection kernel takes proposals without a tail; "
            "use rejection_sample_for_device, which sends tails to the reference"
        )
    check_rejection_inputs(
        draft_token_ids, num_draft_tokens, draft_sparse_ids, draft_sparse_probs,
        target_probs, is_greedy, uniform, emit_uniform, draft_sparse_tail, position_keys,
    )  # fmt: skip
    num_seqs, max_k = draft_token_ids.shape
    vocab_size = target_probs.shape[-1]
    device = target_probs.device
    # [B, K+1], [B]
    output = torch.empty((num_seqs, max_k + 1), dtype=torch.long, device=device)
    num_output = torch.empty((num_seqs,), dtype=torch.long, device=device)
    if num_seqs == 0:
        return output, num_output
    has_sparse = draft_sparse_ids is not None and draft_sparse_probs is not None
    if has_sparse:
        sparse_ids = draft_sparse_ids.long().contiguous()  # [B, K, S]
        sparse_probs = draft_sparse_probs.float().contiguous()  # [B, K, S]
    else:  # never read: HAS_SPARSE is a compile-time False
        sparse_ids = torch.zeros(1, dtype=torch.long, device=device)
        sparse_probs = torch.zeros(1, dtype=torch.float32, device=device)
    num_sparse = sparse_ids.shape[-1] if has_sparse else 1
    block_s = triton.next_power_of_2(max(num_sparse, 1))
    block_v = min(triton.next_power_of_2(vocab_size), max_block_v)
    block_v = max(1, min(block_v, MAX_BLOCK_ELEMENTS // block_s))
    rejection_kernel[(num_seqs,)](
        output, num_output,
        draft_token_ids.long().contiguous(), num_draft_tokens.long().contiguous(),
        sparse_ids, sparse_probs,
        target_probs.float().contiguous(), is_greedy.to(torch.int8).contiguous(),
        uniform.float().contiguous(), emit_uniform.double().contiguous(),
        max_k, vocab_size, num_sparse,
        HAS_SPARSE=has_sparse, BLOCK_V=block_v, BLOCK_S=block_s,
        BLOCK_OUT=triton.next_power_of_2(max_k + 1),
    )  # fmt: skip
    return output, num_output
