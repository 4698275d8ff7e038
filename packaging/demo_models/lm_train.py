"""Minimal deterministic training loop shared by target pre-training and draft distillation."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

LossFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TrainSpec:
    steps: int
    batch: int
    seq_len: int
    lr: float
    warmup: int = 50
    min_lr_frac: float = 0.1
    weight_decay: float = 0.1
    seed: int = 0
    log_every: int = 25


def sample_batch(
    stream: np.ndarray, batch: int, seq_len: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of seq_len + 1 tokens (inputs, next-token labels)."""
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=gen).tolist()
    rows = np.stack([stream[s : s + seq_len + 1] for s in starts]).astype(np.int64)
    data = torch.from_numpy(rows)
    return data[:, :-1], data[:, 1:]


def lr_at(step: int, spec: TrainSpec) -> float:
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    progress = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return spec.lr * (spec.min_lr_frac + (1 - spec.min_lr_frac) * cosine)


def ce_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=x, use_cache=False).logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))


def make_optimizer(model: torch.nn.Module, spec: TrainSpec) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": spec.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=spec.lr, betas=(0.9, 0.95), eps=1e-8)


def train_lm(
    model: torch.nn.Module,
    stream: np.ndarray,
    spec: TrainSpec,
    loss_fn: LossFn = ce_loss,
    log: Callable[[str], None] = print,
) -> list[float]:
    """Train in place; returns the per-log-interval mean losses."""
    gen = torch.Generator().manual_seed(spec.seed)
    opt = make_optimizer(model, spec)
    model.train()
    history: list[float] = []
    running, t0 = 0.0, time.perf_counter()
    for step in range(spec.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, spec)
        x, y = sample_batch(stream, spec.batch, spec.seq_len, gen)
        loss = loss_fn(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running += loss.item()
        if (step + 1) % spec.log_every == 0 or step + 1 == spec.steps:
            n = (step % spec.log_every) + 1
            history.append(running / n)
            elapsed = time.perf_counter() - t0
            log(f"step {step + 1}/{spec.steps} loss {running / n:.4f} {elapsed:.0f}s")
            running = 0.0
    model.eval()
    return history


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, stream: np.ndarray, seq_len: int, max_windows: int = 64
) -> float:
    """Mean next-token cross-entropy over consecutive windows of a held-out stream."""
    model.eval()
    losses = []
    for i in range(min(max_windows, (len(stream) - 1) // seq_len)):
        chunk = torch.from_numpy(stream[i * seq_len : (i + 1) * seq_len + 1].astype(np.int64))
        losses.append(ce_loss(model, chunk[None, :-1], chunk[None, 1:]).item())
    return float(np.mean(losses)) if losses else float("nan")
