"""Pick the rejection sampler for the device: the Triton kernel on CUDA (inputs drawn on the
host are moved there first), the torch reference elsewhere and for proposals with a tail
(the kernel handles listed tokens and greedy point masses; an unlisted draft's class test and
its coupled token, and a sampled row's point-mass draft, matched against the verifier's own
Gumbel-max token, go through the reference, which runs on CUDA tensors as well). Either way,
with `bonus_keys` a sampled row's bonus token is then the Gumbel-max of its position's shared
field (coupled_bonus.py).

`SPECCTL_TRITON=0` keeps the reference on CUDA too (for comparisons). Triton is imported only
on CUDA: on CPU it is never used, costs an import, and its bindings
print leak warnings when the interpreter exits."""

import torch

from daemon.runtime.device import triton_enabled
from daemon.runtime.sampling.coupled_bonus import couple_bonus_tokens
from daemon.runtime.sampling.rejection import matched_drafts, rejection_sample


def rejection_sample_for_device(
    draft_token_ids: torch.Tensor,  # [B, K] int64
    num_draft_tokens: torch.Tensor,  # [B] int64
    draft_sparse_ids: torch.Tensor | None,  # [B, K, S] int64
    draft_sparse_probs: torch.Tensor | None,  # [B, K, S] float32
    target_probs: torch.Tensor,  # [B, K+1, V] float32
    is_greedy: torch.Tensor,  # [B] bool
    uniform: torch.Tensor,  # [B, K] float32
    emit_uniform: torch.Tensor,  # [B] float64
    draft_sparse_tail: torch.Tensor | None = None,  # [B, K] float32
    position_keys: torch.Tensor | None = None,  # [B, K] int64
    bonus_keys: torch.Tensor | None = None,  # [B] int64 field keys of the bonus positions
) -> tuple[torch.Tensor, torch.Tensor]:
    return _rejection_sample(
        draft_token_ids, num_draft_tokens, draft_sparse_ids, draft_sparse_probs, target_probs,
        is_greedy, uniform, emit_uniform, draft_sparse_tail, position_keys, bonus_keys,
    )  # fmt: skip


def _rejection_sample(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    draft_sparse_ids: torch.Tensor | None,
    draft_sparse_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    is_greedy: torch.Tensor,
    uniform: torch.Tensor,
    emit_uniform: torch.Tensor,
    draft_sparse_tail: torch.Tensor | None,
    position_keys: torch.Tensor | None,
    bonus_keys: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    has_tail = draft_sparse_tail is not None and bool((draft_sparse_tail > 0).any())
    if not has_tail:
        draft_sparse_tail = None
    if (
        target_probs.device.type == "cuda"
        and not has_tail
        and (
            position_keys is None
            # a sampled row's point-mass draft is matched (the reference only)
            or not bool(
                matched_drafts(
                    num_draft_tokens.cpu(),
                    None if draft_sparse_probs is None else draft_sparse_probs.cpu(),
                    None,  # no tail here (checked)
                    is_greedy.cpu(),
                    draft_token_ids.shape[1],
                ).any()
            )
        )
    ):
        from daemon.runtime.sampling import rejection_triton

        if rejection_triton.HAS_TRITON and triton_enabled():
            device = target_probs.device
            out, num_out = rejection_triton.rejection_sample_triton(
                *(None if t is None else t.to(device, non_blocking=True)
                  for t in (draft_token_ids, num_draft_tokens, draft_sparse_ids,
                            draft_sparse_probs, target_probs, is_greedy, uniform,
                            emit_uniform))
            )  # fmt: skip
            if bonus_keys is not None:  # the kernel samples every bonus: replaced here
                couple_bonus_tokens(
                    out, num_out, num_draft_tokens.to(device), target_probs, is_greedy,
                    bonus_keys,
                )  # fmt: skip
            return out, num_out
    device = target_probs.device
    return rejection_sample(
        *(None if t is None else t.to(device, non_blocking=True)
          for t in (draft_token_ids, num_draft_tokens, draft_sparse_ids, draft_sparse_probs,
                    target_probs, is_greedy, uniform, emit_uniform, draft_sparse_tail,
                    position_keys, bonus_keys))
    )  # fmt: skip
