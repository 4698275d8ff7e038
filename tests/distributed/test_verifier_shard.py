"""A verifier shard as a Ray actor on its node, driven from this process through RemoteBackend:
placement by label, greedy output identical to target-only decoding, refusals as errors."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from daemon.runtime.engine.request import Request
from daemon.runtime.errors import RequestError
from daemon.runtime.sampling.params import SamplingParams
from daemon.shard.node_context import NODE_LABEL
from daemon.shard.specs import VerifierSpec
from specctl.demo_pair import demo_pair_dirs
from specctl.deploy.actors import Placement, create_verifier, kill_actor
from specctl.deploy.remote_backend import RemoteBackend, served_model
from tests.distributed.conftest import VERIFIER_NODE
from tests.distributed.ray_cluster import TestCluster
from tests.engine.helpers import DeltaCollector, make_engine, run_greedy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NAME = "test-verifier-colocated"
MAX_TOKENS = 24
LOAD_TIMEOUT_S = 180.0


def _prompts(tokenizer) -> list[list[int]]:
    texts = ["def main():", "import os\nimport sys\n", "class Config:\n    def __init__(self", "x"]
    return [tokenizer.encode(t) for t in texts * 2]


@pytest.fixture(scope="module")
def verifier(cluster: TestCluster) -> Iterator[object]:
    target, draft = demo_pair_dirs()
    spec = VerifierSpec(
        target_dir=str(target),
        dtype="float32",
        max_batch_size=8,
        proposer="draft_model",
        draft_dir=str(draft),
        num_speculative_tokens=3,
        num_threads=1,
    )
    handle = create_verifier(NAME, spec, Placement(VERIFIER_NODE))
    yield handle
    kill_actor(NAME)


def test_shard_runs_on_its_labelled_node(cluster: TestCluster, verifier) -> None:
    status = ray.get(verifier.wait_ready.remote(LOAD_TIMEOUT_S), timeout=LOAD_TIMEOUT_S + 30)
    assert status.state == "ready", status.error
    assert status.node_name == VERIFIER_NODE
    node_ids = {n["Labels"][NODE_LABEL]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert status.node_id == node_ids[VERIFIER_NODE]


def test_remote_greedy_equals_target_only(cluster: TestCluster, verifier) -> None:
    model = served_model(verifier, "demo", timeout_s=LOAD_TIMEOUT_S)
    assert model.proposer == "draft_model" and model.max_batch_size == 8
    prompts = _prompts(model.tokenizer)
    target, _ = demo_pair_dirs()
    reference = run_greedy(
        make_engine(target, batch=8, max_model_len=None, dtype="float32"), prompts, MAX_TOKENS
    )

    sink = DeltaCollector()
    backend = RemoteBackend(verifier, model)
    backend.start(sink)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        ids = [f"g{i}" for i in range(len(prompts))]
        for rid, prompt in zip(ids, prompts, strict=True):
            backend.submit(Request(rid, prompt, params))
        sink.wait_finished(ids, timeout_s=120)
        for rid, ref in zip(ids, reference, strict=True):
            assert sink.tokens(rid) == ref.token_ids
            assert sink.last(rid).finish_reason == "length"
        assert max(r.batch_size for o in sink.outputs for r in o.rounds) > 1
        assert sum(r.num_draft_tokens for o in sink.outputs for r in o.rounds) > 0

        with pytest.raises(RequestError, match="context holds"):
            backend.submit(Request("too-long", [1] * 5000, params))
    finally:
        backend.stop()


def test_tokenizer_files_exclude_weights(verifier) -> None:
    files = ray.get(verifier.tokenizer_files.remote(), timeout=60)
    assert "tokenizer.json" in files and "config.json" in files
    assert not any(name.endswith(".safetensors") for name in files)
    target, _ = demo_pair_dirs()
    assert files["tokenizer.json"] == (Path(target) / "tokenizer.json").read_bytes()
