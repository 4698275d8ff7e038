"""The engine on a GPU: decode and verify replayed from CUDA graphs, one per batch bucket and
k bucket, with the same greedy tokens as eager passes and as target-only decoding.

These run only where torch sees a CUDA device (README, "On a GPU": `bench/gpu_checks.sh`
runs them); CPU runs test the same static passes eagerly (tests/model/test_static_pass.py,
tests/engine/test_graphs_ahead.py).
"""

from pathlib import Path

import pytest
import torch

from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.request import Request
from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.runtime.model.static_pass import CUDA_GRAPHS_ENV
from daemon.runtime.proposers.draft_model import DraftModelProposer
from daemon.runtime.sampling.params import SamplingParams
from tests.engine.conftest import MAX_TOKENS
from tests.engine.helpers import make_engine, run_greedy

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _tokens(engine: SpecEngine, prompts: list[list[int]]) -> list[list[int]]:
    return [o.token_ids for o in run_greedy(engine, prompts, MAX_TOKENS)]


def _lean(model: object) -> LlamaForCausalLM:
    assert isinstance(model, LlamaForCausalLM)
    return model


def _draft_model(engine: SpecEngine) -> object:
    assert isinstance(engine.proposer, DraftModelProposer)
    return engine.proposer.model


def test_greedy_on_cuda_matches_target_only_and_eager(
    target_dir: Path, draft_dir: Path, prompts: list[list[int]], reference: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    plain = make_engine(target_dir, device="cuda", backend="lean")
    spec = make_engine(target_dir, target_dir, k=4, device="cuda", backend="lean")
    expected = _tokens(plain, prompts)
    # transformers on the CPU: float32 on both devices, so the same tokens but for argmax
    # near-ties that reduction orders can flip (none in this workload)
    assert expected == reference
    assert _tokens(spec, prompts) == expected
    assert spec.stats.acceptance_rate > 0.97  # the draft is the target
    monkeypatch.setenv(CUDA_GRAPHS_ENV, "0")
    eager = make_engine(target_dir, target_dir, k=4, device="cuda", backend="lean")
    assert _lean(eager.target).static is None
    assert _tokens(eager, prompts) == expected


def test_graphs_are_captured_per_batch_and_k_bucket_before_the_first_request(
    target_dir: Path, draft_dir: Path, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    engine = make_engine(target_dir, draft_dir, k=4, batch=16, device="cuda", backend="lean")
    target, draft = _lean(engine.target), _lean(_draft_model(engine))
    assert target.static is not None and draft.static is not None
    ahead = {(s.batch, s.chunk) for s in target.static.graphs}  # captured by the engine's start
    assert ahead == {(b, t) for b in (1, 2, 4, 8, 16) for t in range(1, 6)}
    assert {(s.batch, s.chunk) for s in draft.static.graphs} == {
        (b, t) for b in (1, 2, 4, 8, 16) for t in (1, 2)
    }
    # the engine reports what it captured (the bench prints it)
    assert engine.graph_capture.num_graphs == len(target.static.graphs) + len(draft.static.graphs)
    assert engine.graph_capture.seconds > 0.0
    captured = {s: g for s, g in target.static.graphs.items() if not s.last_only}
    assert _tokens(engine, prompts[:3]) == reference[:3]  # 3 rows: the 4-row bucket
    assert _tokens(engine, prompts) == reference  # 16 rows
    assert _tokens(engine, prompts) == reference  # the same shapes again
    rounds = {s: g for s, g in target.static.graphs.items() if not s.last_only}
    # every decode and verify pass replayed a graph captured ahead
    assert rounds.keys() == captured.keys()
    assert all(rounds[s] is g for s, g in captured.items())


@pytest.mark.parametrize("sparse_top_k", [0, 32], ids=["coupled", "top-32"])
def test_sampling_on_cuda_accepts_a_draft_equal_to_the_target(
    target_dir: Path, prompts: list[list[int]], sparse_top_k: int
) -> None:
    from daemon.runtime.engine.builder import EngineSpec, build_engine
    from daemon.runtime.engine.config import EngineConfig

    config = EngineConfig(
        max_batch_size=16, num_speculative_tokens=4, draft_sparse_top_k=sparse_top_k
    )
    spec = EngineSpec(target=target_dir, draft=target_dir, device="cuda", backend="lean",
                      max_model_len=256, engine=config)  # fmt: skip
    engine = build_engine(spec).engine
    params = [
        SamplingParams(temperature=t, max_tokens=MAX_TOKENS, seed=i, ignore_eos=True)
        for i, t in enumerate([0.7, 1.0] * 8)
    ]
    outputs = engine.generate(
        Request(f"s{i}", p, sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
    )
    assert all(len(o.token_ids) == MAX_TOKENS for o in outputs)
    vocab = _lean(engine.target).vocab_size
    assert all(0 <= t < vocab for o in outputs for t in o.token_ids)
    assert engine.stats.acceptance_rate >= 0.95
    again = build_engine(spec).engine.generate(
        Request(f"s{i}", p, sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
    )
    assert [o.token_ids for o in again] == [o.token_ids for o in outputs]  # seeded: reproducible
