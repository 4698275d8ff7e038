"""Static-shape decode/verify passes (the shapes CUDA graphs replay) against the ragged forward.

On a CPU the static pass runs eagerly: the same code a graph captures on a GPU, so what is
checked here (padding rows, gathered context buckets, device-built metadata, K/V writes) is
what a graph replays. The capture itself runs only where a CUDA device is.
"""

from pathlib import Path
from typing import Any

import pytest
import torch

from daemon.runtime.errors import RequestError
from daemon.runtime.model import ForwardBatch, LogitsMode, load_model
from daemon.runtime.model.batch import NO_FORK
from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.runtime.model.static_pass import StaticPasses, bucket_up
from tests.model.helpers import ATOL, TinyFactory, assert_caches_match, random_tokens, step

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "mistral-window": ("mistral", {"sliding_window": 5}),
}
PROMPTS = {5: 9, 1: 3, 6: 250}  # slot -> prompt length; slot 6 crosses the 256-position bucket


def _pair(path: Path, device: str = "cpu") -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """The same checkpoint twice: eager, and with static passes (captured on CUDA)."""
    eager = load_model(path, num_slots=8, device=device, backend="lean")
    static = load_model(path, num_slots=8, device=device, backend="lean")
    assert isinstance(eager, LlamaForCausalLM) and isinstance(static, LlamaForCausalLM)
    eager.static = None
    static.enable_static_passes(capture=device == "cuda")
    return eager, static


def _rounds(eager: LlamaForCausalLM, static: LlamaForCausalLM, seed: int) -> None:
    """Prefill (long chunks: eager in both), then decode, verify, rollback and ragged rounds
    (static in one), comparing logits at every real position and every slot's cache up to its
    sequence's length."""
    generator = torch.Generator().manual_seed(seed)
    seq_eager: dict[int, list[int]] = {}
    seq_static: dict[int, list[int]] = {}
    prompts = {s: random_tokens(generator, n) for s, n in PROMPTS.items()}
    assert static.static is not None
    captured = len(static.static.graphs)
    for model, seqs in ((eager, seq_eager), (static, seq_static)):
        step(model, seqs, prompts, dict.fromkeys(prompts, 0), LogitsMode.NONE)
    assert len(static.static.graphs) == captured  # a prefill wants no logits: eager
    # (tokens per row of slots 5, 1, 6; tokens kept before it: a rollback keeps fewer), mode;
    # unequal lengths are a verify with rows drafting different k, or a drafter's catch-up
    rounds = [((1, 1, 1), 0, LogitsMode.LAST), ((5, 5, 5), 0, LogitsMode.ALL)]
    rounds += [((9, 9, 9), -3, LogitsMode.ALL), ((3, 1, 5), 0, LogitsMode.LAST)]
    rounds += [((1, 4, 2), -2, LogitsMode.ALL), ((3, 3, 3), -7, LogitsMode.LAST)]
    rounds += [((1, 1, 1), 0, LogitsMode.ALL)]
    for lengths, keep, mode in rounds:
        for slots in ([5, 1, 6], [6, 1]):  # 3 rows pad to 4; 2 rows in reverse slot order
            sizes = lengths[: len(slots)]  # [6, 1] takes the first two lengths
            chunks = {s: random_tokens(generator, n) for s, n in zip(slots, sizes, strict=True)}
            starts = {s: len(seq_eager[s]) + keep for s in slots}
            expected = step(eager, seq_eager, chunks, starts, mode)
            got = step(static, seq_static, chunks, starts, mode)
            assert expected is not None and got is not None
            assert got.shape == expected.shape
            if mode is LogitsMode.LAST:
                torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
            for b, slot in enumerate(slots):  # ALL: a short chunk's padded positions are garbage
                real = len(chunks[slot])
                torch.testing.assert_close(got[b, :real], expected[b, :real], atol=ATOL, rtol=0)
    assert seq_static == seq_eager
    assert_caches_match(static, eager, seq_eager)
    assert not static.cache.keys[0][[0, 2, 3, 4, 7]].any()  # padding wrote no other slot


@pytest.mark.parametrize("case", list(CASES))
def test_static_passes_match_the_ragged_forward(tiny_checkpoint: TinyFactory, case: str) -> None:
    arch, overrides = CASES[case]
    _rounds(*_pair(tiny_checkpoint(arch, **overrides)), seed=7)


def test_only_short_chunks_that_want_logits_take_the_static_pass(llama_dir: Path) -> None:
    _, model = _pair(llama_dir)
    static = model.static
    assert static is not None

    def batch(chunks: list[list[int]], **kwargs: Any) -> ForwardBatch:
        return ForwardBatch(slots=[0, 1][: len(chunks)], token_ids=chunks,
                            start_positions=[0] * len(chunks), **kwargs)  # fmt: skip

    assert static.accepts(batch([[1, 2], [3, 4]]))
    assert static.accepts(batch([[1, 2], [3, 4]], logits_mode=LogitsMode.LAST))
    assert static.accepts(batch([[1, 2], [3]]))  # padded to 2 tokens a row
    assert not static.accepts(batch([[1, 2], [3, 4]], logits_mode=LogitsMode.NONE))
    # a prompt's chunk comes in any shape: eager, never a graph captured mid-step
    assert not static.accepts(batch([[1, 2], [3, 4]], logits_mode=LogitsMode.LAST, is_prefill=True))
    assert not static.accepts(batch([list(range(17))]))  # longer than DEFAULT_MAX_CHUNK
    near_end = ForwardBatch(slots=[0, 1], token_ids=[[1], [2, 3, 4]], start_positions=[510, 0])
    assert not static.accepts(near_end)  # row 0 padded to 3 tokens would pass max_model_len 512
    fork = ForwardBatch(slots=[0, 0], token_ids=[[1], [2]], start_positions=[3, 3],
                        fork_parents=[NO_FORK, 0], fork_positions=[0, 2])  # fmt: skip
    assert not static.accepts(fork)
    shape = static.shape_of(ForwardBatch(slots=[4, 2, 0], token_ids=[[1, 2, 3]] * 3,
                                         start_positions=[300, 2, 7]))  # fmt: skip
    assert (shape.batch, shape.chunk, shape.context) == (4, 3, 512)
    assert [bucket_up(n, 256, 512) for n in (1, 256, 257, 512)] == [256, 256, 512, 512]


def test_graphs_are_never_captured_off_a_gpu(llama_dir: Path) -> None:
    model = load_model(llama_dir, num_slots=2)
    assert isinstance(model, LlamaForCausalLM) and model.static is None  # the loader's check
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        StaticPasses(model, capture=True)
    stage = load_model(llama_dir, num_slots=2, layers=(0, 1))
    assert isinstance(stage, LlamaForCausalLM)
    with pytest.raises(RequestError, match="whole model"):
        stage.enable_static_passes(capture=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graphs_replay_the_eager_passes(llama_dir: Path) -> None:
    eager, graphed = _pair(llama_dir, device="cuda")
    _rounds(eager, graphed, seed=11)
    assert graphed.static is not None
    shapes = set(graphed.static.graphs)
    assert shapes and all(s.batch in (2, 4) for s in shapes)
    _rounds(eager, graphed, seed=12)  # the same shapes again: replayed, none captured anew
    assert set(graphed.static.graphs) == shapes
