"""Draft distillation: KL to the target's next-token distribution, mixed with the data loss.

A draft trained on the target's soft labels learns to agree with the target (what speculative
decoding's acceptance rate measures) rather than merely to model the data.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lm_train import LossFn


def make_distill_loss(
    teacher: torch.nn.Module, kl_weight: float = 0.8, temperature: float = 1.0
) -> LossFn:
    """loss = kl_weight * T^2 * KL(teacher_T || student_T) + (1 - kl_weight) * CE(data)."""
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)

    def loss_fn(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            t_logits = teacher(input_ids=x, use_cache=False).logits.float()
        s_logits = model(input_ids=x, use_cache=False).logits.float()
        vocab = s_logits.size(-1)
        t_logp = F.log_softmax(t_logits.reshape(-1, vocab) / temperature, dim=-1)
        s_logp = F.log_softmax(s_logits.reshape(-1, vocab) / temperature, dim=-1)
        kl = F.kl_div(s_logp, t_logp, log_target=True, reduction="batchmean")
        ce = F.cross_entropy(s_logits.reshape(-1, vocab), y.reshape(-1))
        return kl_weight * temperature**2 * kl + (1 - kl_weight) * ce

    return loss_fn


@torch.no_grad()
def greedy_agreement(
    draft: torch.nn.Module,
    target: torch.nn.Module,
    stream: torch.Tensor,
    seq_len: int,
    max_windows: int = 32,
) -> float:
    """Teacher-forced fraction of positions where draft argmax == target argmax."""
    draft.eval()
    target.eval()
    agree = total = 0
    for i in range(min(max_windows, len(stream) // seq_len)):
        x = stream[i * seq_len : (i + 1) * seq_len][None].long()
        a = draft(input_ids=x, use_cache=False).logits.argmax(-1)
        b = target(input_ids=x, use_cache=False).logits.argmax(-1)
        agree += int((a == b).sum())
        total += b.numel()
    return agree / max(1, total)
