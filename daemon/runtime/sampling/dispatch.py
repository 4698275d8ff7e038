"""Pick the rejection sampler for the device: the Triton kernel on CUDA, the torch reference
elsewhere. Triton is imported only on CUDA: on CPU it is never used, costs an import, and its
bindings print leak warnings when the interpreter exits."""

import torch

from daemon.runtime.sampling.rejection import rejection_sample


def rejection_sample_for_device(
    draft_token_ids: torch.Tensor,  # [B, K] int64
    num_draft_tokens: torch.Tensor,  # [B] int64
    draft_sparse_ids: torch.Tensor | None,  # [B, K, S] int64
    draft_sparse_probs: torch.Tensor | None,  # [B, K, S] float32
    target_probs: torch.Tensor,  # [B, K+1, V] float32
    is_greedy: torch.Tensor,  # [B] bool
    uniform: torch.Tensor,  # [B, K] float32
    exp_noise: torch.Tensor,  # [B, K+1, V] float32
) -> tuple[torch.Tensor, torch.Tensor]:
    args = (draft_token_ids, num_draft_tokens, draft_sparse_ids, draft_sparse_probs,
            target_probs, is_greedy, uniform, exp_noise)  # fmt: skip
    if target_probs.device.type == "cuda":
        from daemon.runtime.sampling.rejection_triton import rejection_sample_auto

        return rejection_sample_auto(*args)
    return rejection_sample(*args)
