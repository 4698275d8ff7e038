"""Shared checks for the model tests: transformers' own forward as the reference."""

import functools
from collections.abc import Callable
from pathlib import Path

import torch

from daemon.runtime.model import CausalLM, ForwardBatch, LogitsMode
from daemon.runtime.model.llama import LlamaForCausalLM

ATOL = 1e-4
TinyFactory = Callable[..., Path]  # the tiny_checkpoint fixture: (arch, **kwargs) -> dir


@functools.lru_cache(maxsize=16)
def hf_model(path: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True).eval()


@torch.inference_mode()
def hf_logits(path: Path, tokens: list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """transformers' full no-cache forward over `tokens`: float32 logits [T, V]."""
    return hf_model(path, dtype)(torch.tensor([tokens])).logits[0].float()


def random_tokens(generator: torch.Generator, length: int, vocab_size: int = 256) -> list[int]:
    return torch.randint(0, vocab_size, (length,), generator=generator).tolist()


def step(
    model: CausalLM,
    sequences: dict[int, list[int]],
    chunks: dict[int, list[int]],
    starts: dict[int, int],
    mode: LogitsMode = LogitsMode.ALL,
) -> torch.Tensor | None:
    """Append `chunks[slot]` after `starts[slot]` tokens of each slot, in one ragged batch;
    `sequences` (slot -> tokens held) is updated to what each slot now holds."""
    slots = list(chunks)
    batch = ForwardBatch(
        slots=slots,
        token_ids=[chunks[s] for s in slots],
        start_positions=[starts[s] for s in slots],
        logits_mode=mode,
    )
    for s in slots:
        sequences[s] = sequences.get(s, [])[: starts[s]] + chunks[s]
    return model.forward(batch)


def assert_step_matches_hf(
    path: Path,
    logits: torch.Tensor,
    sequences: dict[int, list[int]],
    chunks: dict[int, list[int]],
    atol: float = ATOL,
) -> None:
    """ALL-mode logits [B, T_max, V] equal transformers' logits at each chunk's positions."""
    assert logits.dtype == torch.float32
    assert logits.shape[:2] == (len(chunks), max(len(c) for c in chunks.values()))
    for b, slot in enumerate(chunks):
        num_new = len(chunks[slot])
        expected = hf_logits(path, sequences[slot])[-num_new:]
        torch.testing.assert_close(logits[b, :num_new], expected, atol=atol, rtol=0)


def assert_caches_match(
    mine: LlamaForCausalLM,
    theirs: LlamaForCausalLM,
    sequences: dict[int, list[int]],
    exact: bool = False,
) -> None:
    """Every layer's K/V of every slot in `sequences`, up to the tokens it holds (past a
    sequence's end lies padding's K/V, never read), equal (`exact`: the same bits)."""
    for layer in range(len(theirs.cache.keys)):
        for slot, tokens in sequences.items():
            for cache in ("keys", "values"):
                got = getattr(mine.cache, cache)[layer][slot, :, : len(tokens)]
                expected = getattr(theirs.cache, cache)[layer][slot, :, : len(tokens)]
                if exact:
                    assert torch.equal(got, expected)
                else:
                    torch.testing.assert_close(got, expected)
