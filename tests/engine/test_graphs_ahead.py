"""The shapes an engine captures as CUDA graphs before its first request cover what its rounds
run, and their placeholder passes leave decoding unchanged.

On a CPU the static passes run eagerly (nothing is captured), so what is checked here is the
shape set and the placeholder inputs a GPU captures from; tests/engine/test_cuda_engine.py
checks the capture itself where a GPU is.
"""

from collections.abc import Callable
from pathlib import Path

import torch

from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.graphs_ahead import (
    DRAFT_CHUNKS,
    GraphCapture,
    capture_graphs_ahead,
    verify_chunks,
)
from daemon.runtime.model import ForwardBatch, load_model
from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.runtime.model.static_pass import StaticPasses, StaticShape
from daemon.runtime.proposers.draft_model import DraftModelProposer
from tests.engine.conftest import MAX_TOKENS
from tests.engine.helpers import run_greedy
from tests.tiny_models import make_tiny_checkpoint

K = 4
BATCH = 16


def _static_model(path: Path) -> LlamaForCausalLM:
    model = load_model(path, num_slots=BATCH, max_model_len=256, backend="lean")
    assert isinstance(model, LlamaForCausalLM)
    model.enable_static_passes(capture=False)
    return model


def _recording(static: StaticPasses, seen: set[StaticShape]) -> None:
    """Record the shape of every pass the static path runs (the real pass still runs)."""
    forward: Callable[[ForwardBatch], torch.Tensor] = static.forward

    def recorded(batch: ForwardBatch) -> torch.Tensor:
        seen.add(static.shape_of(batch))
        return forward(batch)

    static.forward = recorded  # type: ignore[method-assign]


def test_shapes_ahead_cover_every_round(
    target_dir: Path, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    # the draft is a second copy of the target: every draft accepted, so the drafter also
    # feeds a round's last draft with the bonus token (2 tokens a row)
    target, draft = _static_model(target_dir), _static_model(target_dir)
    assert target.static is not None and draft.static is not None
    verify_ahead = target.static.shapes_ahead(BATCH, verify_chunks(K), last_only=False)
    draft_ahead = draft.static.shapes_ahead(BATCH, DRAFT_CHUNKS, last_only=True)
    # every batch bucket x every length, at the one context bucket of max_model_len 256
    assert {(s.batch, s.chunk) for s in verify_ahead} == {
        (b, t) for b in (1, 2, 4, 8, 16) for t in range(1, K + 2)
    }
    assert {s.context for s in verify_ahead + draft_ahead} == {256}
    # the placeholder passes (what a GPU captures from) run, then decoding is unchanged
    for model, shapes in ((target, verify_ahead), (draft, draft_ahead)):
        assert model.static is not None
        for shape in shapes:
            hidden = model.static._hidden(shape, model.static.placeholder_inputs(shape))
            assert hidden.shape[0] == shape.batch
    seen_target: set[StaticShape] = set()
    seen_draft: set[StaticShape] = set()
    _recording(target.static, seen_target)
    _recording(draft.static, seen_draft)
    config = EngineConfig(max_batch_size=BATCH, num_speculative_tokens=K)
    engine = SpecEngine(target, DraftModelProposer(draft), config)
    # no graphs on a CPU
    assert capture_graphs_ahead(target, engine.proposer, BATCH, K) == GraphCapture(0, 0.0)
    assert [o.token_ids for o in run_greedy(engine, prompts, MAX_TOKENS)] == reference
    assert [o.token_ids for o in run_greedy(engine, prompts[:3], MAX_TOKENS)] == reference[:3]
    # short prompts' prefill takes the static path too (last logits only): not captured ahead
    rounds = {s for s in seen_target if not s.last_only}
    assert rounds and rounds <= set(verify_ahead)
    assert {s.batch for s in rounds} >= {4, 16}
    assert {s.chunk for s in seen_draft} == set(DRAFT_CHUNKS)
    assert seen_draft <= set(draft_ahead)


def test_long_contexts_are_left_to_first_use(tmp_path: Path, target_dir: Path) -> None:
    long = make_tiny_checkpoint(tmp_path, with_tokenizer=False, max_position_embeddings=8192)
    model = load_model(long, num_slots=2, max_model_len=8192, backend="lean")
    assert isinstance(model, LlamaForCausalLM)
    model.enable_static_passes(capture=False)
    assert model.static is not None
    shapes = model.static.shapes_ahead(2, [1, 3], last_only=False)
    assert sorted({s.context for s in shapes}) == [256, 512, 1024, 2048]
    assert {(s.batch, s.chunk) for s in shapes} == {(1, 1), (1, 3), (2, 1), (2, 3)}
    small = load_model(target_dir, num_slots=2, max_model_len=300, backend="lean")
    assert isinstance(small, LlamaForCausalLM)
    small.enable_static_passes(capture=False)
    assert small.static is not None
    assert sorted({s.context for s in small.static.shapes_ahead(1, [1], False)}) == [256, 300]


def test_nothing_is_captured_without_graphs(target_dir: Path) -> None:
    model = _static_model(target_dir)
    assert model.static is not None
    assert model.static.capture_ahead(BATCH, [1, 2], last_only=False) == 0
    assert not model.static.graphs
