"""Data parallelism: two replicas (verifier shards with their drafts) on two Ray nodes behind
the router. Requests spread over both; outputs equal target-only; killing one replica leaves
the other serving."""

import os
import signal
import time
from collections.abc import Iterator

import pytest
import ray

from daemon.runtime.engine.request import Request
from daemon.runtime.sampling.params import SamplingParams
from daemon.shard.specs import VerifierSpec
from specctl.demo_pair import demo_pair_dirs
from specctl.deploy.actors import Placement, create_verifier, kill_actor
from specctl.deploy.remote_backend import RemoteBackend, served_model
from specctl.deploy.router import RouterBackend
from tests.distributed.conftest import DRAFTER_NODE, VERIFIER_NODE
from tests.engine.helpers import DeltaCollector, make_engine, run_greedy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NAMES = ["test-dp-replica-0", "test-dp-replica-1"]
NODES = [VERIFIER_NODE, DRAFTER_NODE]
MAX_TOKENS = 16
LOAD_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def replicas(cluster) -> Iterator[list[object]]:
    target, draft = demo_pair_dirs()
    spec = VerifierSpec(
        target_dir=str(target),
        dtype="float32",
        max_batch_size=4,
        proposer="draft_model",
        draft_dir=str(draft),
        num_speculative_tokens=3,
        num_threads=1,
    )
    handles = [
        create_verifier(name, spec, Placement(node))
        for name, node in zip(NAMES, NODES, strict=True)
    ]
    yield handles
    for name in NAMES:
        kill_actor(name)


def test_requests_spread_and_a_dead_replica_leaves_the_other_serving(replicas) -> None:
    models = [served_model(h, "demo", timeout_s=LOAD_TIMEOUT_S) for h in replicas]
    nodes = [ray.get(h.status.remote(), timeout=30).node_name for h in replicas]
    assert nodes == NODES  # one replica per node
    tokenizer = models[0].tokenizer
    texts = ["def main():", "import os", "class A:", "for i in range(", "x = ", "return"]
    prompts = [tokenizer.encode(t) for t in texts * 2]
    target, _ = demo_pair_dirs()
    reference = run_greedy(
        make_engine(target, batch=4, max_model_len=None, dtype="float32"), prompts, MAX_TOKENS
    )

    sink = DeltaCollector()
    router = RouterBackend(
        [RemoteBackend(h, m, call_timeout_s=10.0) for h, m in zip(replicas, models, strict=True)]
    )
    # the endpoint's room is both replicas' batches and queues, not the first one's
    assert router.model.max_requests == sum(m.max_requests or 0 for m in models) > 0
    assert all(m.max_requests for m in models)
    router.start(sink)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        ids = [f"r{i}" for i in range(len(prompts))]
        for rid, prompt in zip(ids, prompts, strict=True):
            router.submit(Request(rid, prompt, params))
        sink.wait_finished(ids, timeout_s=120)
        wrong = [
            (rid, router._owner.get(rid), sink.tokens(rid), ref.token_ids)
            for rid, ref in zip(ids, reference, strict=True)
            if sink.tokens(rid) != ref.token_ids
        ]
        assert not wrong, str([(w[0], w[2], w[3]) for w in wrong])
        routed = [n for n, _, _ in router.replica_loads()]
        assert all(n >= 3 for n in routed), routed  # least-outstanding routing spreads them

        # replica 0 dies mid-generation (no restart): its requests fail, replica 1 serves on
        endless = SamplingParams(max_tokens=100_000, ignore_eos=True)
        router.submit(Request("long-0", prompts[0], endless))
        router.submit(Request("long-1", prompts[1], endless))
        _wait_tokens(sink, ["long-0", "long-1"])
        pid = ray.get(replicas[0].status.remote(), timeout=30).pid
        os.kill(pid, signal.SIGKILL)
        doomed = next(rid for rid in ("long-0", "long-1") if _owner_index(router, rid) == 0)
        sink.wait_finished([doomed], timeout_s=30)
        assert sink.last(doomed).finish_reason == "error"
        survivor = "long-1" if doomed == "long-0" else "long-0"
        before = len(sink.tokens(survivor))
        after_ids = [f"after{i}" for i in range(4)]
        for rid in after_ids:
            router.submit(Request(rid, prompts[2], params))
        sink.wait_finished(after_ids, timeout_s=120)
        for rid in after_ids:
            assert sink.tokens(rid) == reference[2].token_ids
        assert len(sink.tokens(survivor)) > before  # the other replica never stopped
        router.abort(survivor)
        sink.wait_finished([survivor], timeout_s=30)
        assert sink.last(survivor).finish_reason == "abort"
    finally:
        router.stop()


def _owner_index(router: RouterBackend, request_id: str) -> int:
    replica = router._owner[request_id]
    return replica.index


def _wait_tokens(sink: DeltaCollector, ids: list[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(len(sink.tokens(rid)) >= 2 for rid in ids):
        assert time.monotonic() < deadline, "no tokens in time"
        time.sleep(0.05)
