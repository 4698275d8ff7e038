"""Ragged batches over the per-slot cache: appends, LAST/NONE modes, rollback, pad isolation."""

from pathlib import Path

import pytest
import torch

from daemon.runtime.errors import RequestError
from daemon.runtime.model import ForwardBatch, LogitsMode, load_model
from daemon.runtime.model.forward_metadata import build_metadata
from daemon.runtime.model.llama import LlamaForCausalLM
from tests.model.helpers import (
    ATOL,
    TinyFactory,
    assert_step_matches_hf,
    hf_logits,
    random_tokens,
    step,
)


@pytest.fixture(params=["lean", "hf"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


def test_ragged_appends_match_full_forward(llama_dir: Path, backend: str) -> None:
    """Non-consecutive slots, different prompt lengths, then chunks of 1..5 tokens."""
    model = load_model(llama_dir, num_slots=8, backend=backend)
    generator = torch.Generator().manual_seed(2)
    sequences: dict[int, list[int]] = {}
    lengths = {5: 9, 1: 2, 6: 17, 3: 1}
    chunks = {s: random_tokens(generator, n) for s, n in lengths.items()}
    logits = step(model, sequences, chunks, dict.fromkeys(chunks, 0))
    assert_step_matches_hf(llama_dir, logits, sequences, chunks)
    for chunk_lengths in ({5: 1, 1: 5, 6: 3, 3: 1}, {5: 4, 1: 1, 6: 1, 3: 2}):
        chunks = {s: random_tokens(generator, n) for s, n in chunk_lengths.items()}
        starts = {s: len(sequences[s]) for s in chunks}
        logits = step(model, sequences, chunks, starts)
        assert_step_matches_hf(llama_dir, logits, sequences, chunks)


def test_rollback_then_different_tokens(llama_dir: Path, backend: str) -> None:
    model = load_model(llama_dir, num_slots=4, backend=backend)
    generator = torch.Generator().manual_seed(3)
    sequences: dict[int, list[int]] = {}
    prompts = {0: random_tokens(generator, 10), 1: random_tokens(generator, 6)}
    step(model, sequences, prompts, {0: 0, 1: 0}, LogitsMode.NONE)
    drafts = {0: random_tokens(generator, 5), 1: random_tokens(generator, 4)}
    step(model, sequences, drafts, {0: 10, 1: 6}, LogitsMode.NONE)
    # keep 2 of slot 0's five draft tokens and none of slot 1's, then append new ones
    fixes = {0: random_tokens(generator, 3), 1: random_tokens(generator, 1)}
    logits = step(model, sequences, fixes, {0: 12, 1: 6})
    assert sequences[0][:12] == prompts[0] + drafts[0][:2]
    assert_step_matches_hf(llama_dir, logits, sequences, fixes)


def test_last_mode_returns_each_sequence_last_token(llama_dir: Path, backend: str) -> None:
    model = load_model(llama_dir, backend=backend)
    generator = torch.Generator().manual_seed(4)
    chunks = {0: random_tokens(generator, 7), 1: random_tokens(generator, 2)}
    sequences: dict[int, list[int]] = {}
    logits = step(model, sequences, chunks, {0: 0, 1: 0}, LogitsMode.LAST)
    assert logits is not None and logits.shape == (2, model.vocab_size)
    assert logits.dtype == torch.float32
    for b, slot in enumerate(chunks):
        expected = hf_logits(llama_dir, sequences[slot])[-1]
        torch.testing.assert_close(logits[b], expected, atol=ATOL, rtol=0)


def test_none_mode_fills_cache_only(llama_dir: Path, backend: str) -> None:
    model = load_model(llama_dir, backend=backend)
    prompt = list(range(40, 52))
    assert step(model, {}, {2: prompt}, {2: 0}, LogitsMode.NONE) is None
    logits = step(model, {}, {2: [7]}, {2: len(prompt)}, LogitsMode.LAST)
    assert logits is not None
    expected = hf_logits(llama_dir, [*prompt, 7])[-1]
    torch.testing.assert_close(logits[0], expected, atol=ATOL, rtol=0)


def test_pad_tokens_never_written(llama_dir: Path) -> None:
    model = load_model(llama_dir, num_slots=2)
    assert isinstance(model, LlamaForCausalLM)
    step(model, {}, {0: list(range(10)), 1: [5, 6]}, {0: 0, 1: 0}, LogitsMode.NONE)
    for keys, values in zip(model.cache.keys, model.cache.values, strict=True):
        # [H_kv, M, D] of slot 1: only positions 0 and 1 were real tokens
        assert keys[1, :, :2].abs().sum() > 0 and values[1, :, :2].abs().sum() > 0
        assert keys[1, :, 2:].abs().sum() == 0 and values[1, :, 2:].abs().sum() == 0


def test_free_slot_then_reuse(llama_dir: Path, backend: str) -> None:
    model = load_model(llama_dir, num_slots=1, backend=backend)
    step(model, {}, {0: list(range(30))}, {0: 0}, LogitsMode.NONE)
    model.free_slot(0)
    logits = step(model, {}, {0: [1, 2, 3]}, {0: 0})
    assert logits is not None
    torch.testing.assert_close(logits[0], hf_logits(llama_dir, [1, 2, 3]), atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("slots", "starts", "lengths", "message"),
    [
        ([0], [60], [5], "exceed max_model_len 64"),
        ([0, 1], [0, 64], [1, 1], "exceed max_model_len 64"),
        ([4], [0], [1], "slot 4 out of range"),
        ([-1], [0], [1], "slot -1 out of range"),
        ([0], [-1], [1], "negative"),
    ],
)
def test_out_of_range_requests(
    llama_dir: Path,
    backend: str,
    slots: list[int],
    starts: list[int],
    lengths: list[int],
    message: str,
) -> None:
    model = load_model(llama_dir, num_slots=4, max_model_len=64, backend=backend)
    batch = ForwardBatch(slots=slots, token_ids=[[1] * n for n in lengths], start_positions=starts)
    with pytest.raises(RequestError, match=message):
        model.forward(batch)


def test_token_id_out_of_vocab(llama_dir: Path, backend: str) -> None:
    model = load_model(llama_dir, backend=backend)
    batch = ForwardBatch(slots=[0], token_ids=[[1, model.vocab_size]], start_positions=[0])
    with pytest.raises(RequestError, match="token id out of range"):
        model.forward(batch)


@pytest.mark.parametrize(
    ("slots", "span", "scattered"),
    [
        ([0, 1, 2], (0, 3), False),  # the span is the batch in order: a view, nothing moved
        ([3, 0, 2], (0, 4), True),  # out of order with an idle slot (1) inside the span
        ([0, 11], None, False),  # span 12 > 4 x 2 rows: the batch's slots are gathered
    ],
)
def test_every_kv_read_path_matches_hf(
    tiny_checkpoint: TinyFactory, slots: list[int], span: tuple[int, int] | None, scattered: bool
) -> None:
    """Attention reads the slot span as one view (idle span rows computed and dropped) or
    gathers the batch's slots; grouped-query heads stacked along the query axis (4 heads on 2
    KV heads). Every path gives transformers' logits, with the idle slot holding stale K/V."""
    path = tiny_checkpoint("llama", num_heads=4, num_kv_heads=2)
    model = load_model(path, num_slots=12)
    generator = torch.Generator().manual_seed(7)
    sequences: dict[int, list[int]] = {}
    step(model, {}, {1: random_tokens(generator, 20)}, {1: 0}, LogitsMode.NONE)  # stale slot
    prompts = {s: random_tokens(generator, 3 + 4 * i) for i, s in enumerate(slots)}
    logits = step(model, sequences, prompts, dict.fromkeys(slots, 0))
    assert_step_matches_hf(path, logits, sequences, prompts)
    chunks = {s: random_tokens(generator, 1 + i) for i, s in enumerate(slots)}
    batch = ForwardBatch(
        slots=slots,
        token_ids=[chunks[s] for s in slots],
        start_positions=[len(sequences[s]) for s in slots],
    )
    meta = build_metadata(batch, model.device)
    assert meta.slot_span == span and (meta.span_rows is not None) == scattered
    logits = step(model, sequences, chunks, {s: len(sequences[s]) for s in slots})
    assert_step_matches_hf(path, logits, sequences, chunks)
