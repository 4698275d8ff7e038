"""The forward pass's shortcuts give transformers' logits: attention without a mask where every
query sees every key (a decode step) or in the kernel's causal mode (a prefill; the parity
tests' ragged prompts run it too), K/V written by one slice copy (a batch of one row) or
without gathering the real tokens (every cell of the batch real), and q and k rotated in one
call."""

from pathlib import Path

import pytest
import torch

from daemon.runtime.model import ForwardBatch, LogitsMode, load_model
from daemon.runtime.model.forward_metadata import ForwardMetadata, build_metadata
from tests.model.helpers import TinyFactory, assert_step_matches_hf, random_tokens, step
from tests.model.test_parity import VARIANTS

FAST_PATH_VARIANTS = ["llama", "llama-mqa", "qwen3-qk-norm", "mistral-window", "qwen2-window"]


@pytest.mark.parametrize("variant", FAST_PATH_VARIANTS)
def test_single_row_decode_matches_transformers(tiny_checkpoint: TinyFactory, variant: str) -> None:
    """One sequence: prefill, one-token steps (no mask, slice writes; the window variants
    outgrow their window of 4-5 tokens, so their mask comes back), then a verify-sized chunk."""
    arch, kwargs = VARIANTS[variant]
    path = tiny_checkpoint(arch, **kwargs)
    model = load_model(path, num_slots=4)
    generator = torch.Generator().manual_seed(11)
    sequences: dict[int, list[int]] = {}
    chunk = {2: random_tokens(generator, 9)}  # a prefill past the 4-5 token windows
    assert_step_matches_hf(path, step(model, sequences, chunk, {2: 0}), sequences, chunk)
    for _ in range(4):
        chunk = {2: random_tokens(generator, 1)}
        logits = step(model, sequences, chunk, {2: len(sequences[2])})
        assert_step_matches_hf(path, logits, sequences, chunk)
    chunk = {2: random_tokens(generator, 5)}
    logits = step(model, sequences, chunk, {2: len(sequences[2])})
    assert_step_matches_hf(path, logits, sequences, chunk)


@pytest.mark.parametrize("variant", ["llama", "qwen3-qk-norm", "mistral-window"])
def test_full_batches_match_transformers(tiny_checkpoint: TinyFactory, variant: str) -> None:
    """Rows of equal chunks: slots in order and of equal length (no mask), then out of
    order, then of different lengths (a mask), every one written without a gather."""
    arch, kwargs = VARIANTS[variant]
    path = tiny_checkpoint(arch, **kwargs)
    model = load_model(path, num_slots=6)
    generator = torch.Generator().manual_seed(12)
    sequences: dict[int, list[int]] = {}
    prompts = {s: random_tokens(generator, 6) for s in (1, 2, 3)}
    assert_step_matches_hf(
        path, step(model, sequences, prompts, dict.fromkeys(prompts, 0)), sequences, prompts
    )
    for slots, size in (((1, 2, 3), 1), ((3, 1, 2), 1), ((2, 3, 1), 3)):
        chunks = {s: random_tokens(generator, size) for s in slots}
        logits = step(model, sequences, chunks, {s: len(sequences[s]) for s in slots})
        assert_step_matches_hf(path, logits, sequences, chunks)
    # slot 2 is now a token behind the others: a one-token step needs a mask again
    chunks = {1: random_tokens(generator, 1), 2: random_tokens(generator, 1)}
    logits = step(model, sequences, chunks, {1: len(sequences[1]), 2: len(sequences[2]) - 1})
    assert_step_matches_hf(path, logits, sequences, chunks)


def _meta(slots: list[int], chunks: list[list[int]], starts: list[int]) -> ForwardMetadata:
    batch = ForwardBatch(slots, chunks, starts, LogitsMode.LAST)
    return build_metadata(batch, torch.device("cpu"))


def test_which_batches_take_the_shortcuts() -> None:
    one = _meta([3], [[5]], [9])
    assert one.sees_all and one.single_row == (3, 9) and one.writes_grid
    assert one.mask(None) is None and one.mask(10) is None
    assert one.mask(4) is not None  # a window shorter than the context hides keys
    in_order = _meta([2, 3], [[5], [6]], [7, 7])
    assert in_order.sees_all and in_order.single_row is None and in_order.writes_grid
    shuffled = _meta([3, 2], [[5], [6]], [7, 7])
    assert shuffled.sees_all and shuffled.mask(None) is None
    uneven = _meta([2, 3], [[5], [6]], [7, 6])  # row 1 must not see key 7
    assert not uneven.sees_all and uneven.mask(None) is not None
    idle = _meta([1, 3], [[5], [6]], [7, 7])  # slot 2 is an idle span row: key 0 only
    assert not idle.sees_all
    verify = _meta([0], [[5, 6, 7]], [4])  # causal within the chunk
    assert not verify.sees_all and verify.single_row == (0, 4)
    ragged = _meta([0, 1], [[5, 6, 7], [8]], [4, 6])
    assert not ragged.writes_grid and not ragged.sees_all and not ragged.from_zero
    prefill = _meta([0, 2], [[5, 6, 7], [8]], [0, 0])  # the kernel's causal mode, no mask
    assert prefill.from_zero and not prefill.writes_grid


def test_single_row_write_fills_exactly_its_positions(tiny_checkpoint: TinyFactory) -> None:
    """The slice copy lands where the scatter would: positions start..start+T-1 of the slot,
    every other slot and position untouched."""
    path: Path = tiny_checkpoint("llama")
    model = load_model(path, num_slots=3)
    cache = model.cache  # type: ignore[attr-defined]
    model.forward(ForwardBatch([1], [[4, 5, 6, 7]], [0], LogitsMode.NONE))
    written = [(k != 0).any(dim=(1, 3)) for k in cache.keys]  # [S, M] per layer
    for mask in written:
        assert mask[1, :4].all() and not mask[1, 4:].any()
        assert not mask[0].any() and not mask[2].any()


@pytest.mark.parametrize("variant", ["llama", "llama-mqa", "mistral-window", "qwen2-window"])
def test_native_attention_matches_the_torch_path(
    tiny_checkpoint: TinyFactory, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The native decode attention (rotary, K/V writes and attention in one call) against the
    torch ops it replaces, model against model: prefills, one-token steps, ragged verify-sized
    chunks of rows out of slot order, a row padded behind a longer one, windows outgrown."""
    from daemon.runtime.model import native

    if native.kernels() is None:
        pytest.skip("native kernels not built")
    arch, kwargs = VARIANTS[variant]
    path = tiny_checkpoint(arch, **kwargs)
    monkeypatch.setenv(native.DISABLE_ENV, "0")
    reference = load_model(path, num_slots=6)
    monkeypatch.delenv(native.DISABLE_ENV)
    fast = load_model(path, num_slots=6)
    assert fast.layers[0].self_attn.is_native and not reference.layers[0].self_attn.is_native
    generator = torch.Generator().manual_seed(21)
    held: dict[str, dict[int, list[int]]] = {"fast": {}, "reference": {}}
    batches = [
        {1: random_tokens(generator, 12), 4: random_tokens(generator, 3)},  # 3: native prefill
        {4: random_tokens(generator, 1), 1: random_tokens(generator, 1)},
        {1: random_tokens(generator, 5), 4: random_tokens(generator, 2)},  # padded row
        {4: random_tokens(generator, 7)},
        {1: random_tokens(generator, 1), 4: random_tokens(generator, 1)},
    ]
    for chunks in batches:
        outputs = []
        for name, model in (("fast", fast), ("reference", reference)):
            starts = {s: len(held[name].get(s, [])) for s in chunks}
            meta = build_metadata(
                ForwardBatch(list(chunks), list(chunks.values()), list(starts.values()),
                             LogitsMode.ALL),
                torch.device("cpu"),
            )  # fmt: skip
            assert (meta.native_rows is not None) == (max(map(len, chunks.values())) <= 16)
            outputs.append(step(model, held[name], chunks, starts))
        got, want = outputs
        assert got is not None and want is not None
        for row, chunk in enumerate(chunks.values()):  # the pads' logits are not used
            torch.testing.assert_close(got[row, : len(chunk)], want[row, : len(chunk)],
                                       rtol=1e-4, atol=1e-5)  # fmt: skip
