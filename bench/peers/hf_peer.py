"""Hugging Face transformers as a peer engine: plain greedy `generate` and assisted generation.

Runs in the project's own venv, in-process. Requests go one at a time (batch 1); exactly
`max_tokens` tokens are generated for each because eos is switched off for the call. A warm-up
generate on the first prompt runs before the clock starts, and model loading is timed apart.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.peers.result import PeerResult, acceptance_figures, tokens_per_second

WARMUP_MAX_TOKENS = 8
SAMPLING_SEED = 1234  # torch's generator before a timed run (sampled generate draws from it)
SEQUENTIAL = "sequential"
SCHEDULES = ("constant", "heuristic", "heuristic_transient")


@dataclass
class _Timed:
    outputs: list[list[int]]
    wall_s: float


def load_causal_lm(
    path: str | Path, dtype: str | torch.dtype = "float32", device: str = "cpu"
) -> Any:
    """A transformers causal LM from a local checkpoint directory, in eval mode on `device`."""
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype)
    return model.to(device).eval()


def _loaded(
    model: str | Path | torch.nn.Module, dtype: str | torch.dtype, device: str = "cpu"
) -> tuple[Any, float]:
    start = time.perf_counter()
    if isinstance(model, torch.nn.Module):
        return model, 0.0
    return load_causal_lm(model, dtype, device), time.perf_counter() - start


def _sampling(temperature: float) -> dict[str, Any]:
    """generate()'s sampling arguments: greedy at 0; else the full distribution at the
    temperature (top-k and top-p off: a checkpoint's defaults, such as top_k 50, would sample
    another distribution than the other engines do)."""
    if temperature == 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}


def _generate_one(model: Any, prompt: Sequence[int], max_tokens: int, **kwargs: Any) -> list[int]:
    input_ids = torch.tensor([list(prompt)], dtype=torch.long, device=model.device)
    kwargs = {"do_sample": False, **kwargs}
    with torch.inference_mode():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_tokens,
            min_new_tokens=None,
            eos_token_id=None,  # a keyword None overrides the checkpoint's eos: no early stop
            **kwargs,
        )
    generated = out[0, input_ids.shape[1] :].tolist()
    if len(generated) != max_tokens:
        raise RuntimeError(f"generate returned {len(generated)} tokens, asked for {max_tokens}")
    return generated


def _warm_up(model: Any, prompts: Sequence[Sequence[int]], max_tokens: int, **kwargs: Any) -> None:
    """A short untimed generate on the first prompt (first-call allocations, lazy init)."""
    if prompts:
        _generate_one(model, prompts[0], min(max_tokens, WARMUP_MAX_TOKENS), **kwargs)


def _timed_sequential(
    model: Any, prompts: Sequence[Sequence[int]], max_tokens: int, **kwargs: Any
) -> _Timed:
    """Every prompt one after another, batch 1, under one wall clock (sampling draws from the
    torch generator, seeded here so that a run repeats)."""
    torch.manual_seed(SAMPLING_SEED)
    start = time.perf_counter()
    outputs = [_generate_one(model, prompt, max_tokens, **kwargs) for prompt in prompts]
    return _Timed(outputs, time.perf_counter() - start)


def _result(engine: str, timed: _Timed, load_s: float, **fields: Any) -> PeerResult:
    num_tokens = sum(len(ids) for ids in timed.outputs)
    return PeerResult(
        engine=engine,
        mode=SEQUENTIAL,
        num_requests=len(timed.outputs),
        num_tokens=num_tokens,
        wall_s=timed.wall_s,
        tokens_per_s=tokens_per_second(num_tokens, timed.wall_s),
        load_s=load_s,
        output_token_ids=timed.outputs,
        acceptance_rate=fields.pop("acceptance_rate", None),
        mean_acceptance_length=fields.pop("mean_acceptance_length", None),
        **fields,
    )


def run_hf_generate(
    target: str | Path | torch.nn.Module,
    prompts_token_ids: Sequence[Sequence[int]],
    max_tokens: int,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    temperature: float = 0.0,
) -> PeerResult:
    """Plain `generate` (greedy at temperature 0), batch 1, every prompt in turn; `target` is a
    path or a model."""
    model, load_s = _loaded(target, dtype, device)
    kwargs = _sampling(temperature)
    _warm_up(model, prompts_token_ids, max_tokens, **kwargs)
    timed = _timed_sequential(model, prompts_token_ids, max_tokens, **kwargs)
    how = "greedy" if temperature == 0 else f"T={temperature:g}"
    return _result("hf-generate", timed, load_s, note=f"transformers {how}, {_dtype_of(model)}")


class _ForwardCounter:
    """Counts forward calls of a module while armed (a PyTorch forward hook, removed on exit)."""

    def __init__(self) -> None:
        self.calls = 0

    @contextmanager
    def counting(self, module: torch.nn.Module) -> Iterator[None]:
        handle = module.register_forward_hook(self._hook)
        try:
            yield
        finally:
            handle.remove()

    def _hook(self, *_: Any) -> None:
        self.calls += 1


def _configure_assistant(draft: Any, num_assistant_tokens: int, schedule: str) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown num_assistant_tokens_schedule {schedule!r}; one of {SCHEDULES}")
    config = draft.generation_config
    config.num_assistant_tokens = num_assistant_tokens
    config.num_assistant_tokens_schedule = schedule
    # 0 turns the early-exit confidence check off, so each step drafts the full K tokens.
    config.assistant_confidence_threshold = 0.0


def run_hf_assisted(
    target: str | Path | torch.nn.Module,
    draft: str | Path | torch.nn.Module,
    prompts_token_ids: Sequence[Sequence[int]],
    max_tokens: int,
    num_assistant_tokens: int,
    schedule: str = "constant",
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    temperature: float = 0.0,
) -> PeerResult:
    """Assisted generation (`generate(assistant_model=draft)`), batch 1, in turn; greedy at
    temperature 0, else speculative sampling at that temperature.

    Acceptance is measured with forward hooks during the timed runs: every assisted step is one
    target forward that emits one token beyond the accepted ones, and every drafted token one
    draft forward. So accepted = generated - target forwards and proposed = draft forwards.
    A preloaded draft keeps the assistant settings written into its generation_config.
    """
    target_model, target_load_s = _loaded(target, dtype, device)
    draft_model, draft_load_s = _loaded(draft, dtype, device)
    if draft_model is target_model:
        raise ValueError("draft and target are one module object: load the draft separately")
    _configure_assistant(draft_model, num_assistant_tokens, schedule)
    steps, drafted = _ForwardCounter(), _ForwardCounter()
    kwargs = {"assistant_model": draft_model, **_sampling(temperature)}
    _warm_up(target_model, prompts_token_ids, max_tokens, **kwargs)
    with steps.counting(target_model), drafted.counting(draft_model):
        timed = _timed_sequential(target_model, prompts_token_ids, max_tokens, **kwargs)
    accepted = sum(map(len, timed.outputs)) - steps.calls
    rate, length = acceptance_figures(steps.calls, drafted.calls, accepted)
    how = "" if temperature == 0 else f", T={temperature:g}"
    note = (
        f"transformers assisted, K={num_assistant_tokens} {schedule}{how}, "
        f"{_dtype_of(target_model)}"
    )
    return _result(
        "hf-assisted",
        timed,
        target_load_s + draft_load_s,
        acceptance_rate=rate,
        mean_acceptance_length=length,
        note=note,
    )


def _dtype_of(model: Any) -> str:
    return str(getattr(model, "dtype", "unknown")).removeprefix("torch.")
