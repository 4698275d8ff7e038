"""Drafter and verifier as Ray actors on two different nodes of a real local cluster: greedy
output identical to target-only decoding (batch 1 and a ragged batch of 8; sync and
overlapped; fixed k, adaptive k, n-gram), and drafter faults (killed and restarted by Ray, or
killed for good and re-created elsewhere) that cost speculation for a while, never tokens."""

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import ray

from daemon.runtime.engine.request import Request
from daemon.runtime.sampling.params import SamplingParams
from daemon.shard.specs import DrafterSpec, VerifierSpec
from specctl.demo_pair import demo_pair_dirs
from specctl.deploy.actors import Placement, create_drafter, create_verifier, kill_actor
from specctl.deploy.remote_backend import RemoteBackend, served_model
from tests.distributed.conftest import DRAFTER_NODE, VERIFIER_NODE
from tests.distributed.ray_cluster import TestCluster
from tests.distributed.workload import TEXTS
from tests.distributed.workload import target_only as target_only_outputs
from tests.engine.helpers import DeltaCollector, make_engine, run_greedy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LOAD_TIMEOUT_S = 180.0
FINISH_TIMEOUT_S = 120.0
MAX_TOKENS = 24
PREFILL_CHUNK = 4


@dataclass(slots=True)
class Pair:
    name: str
    verifier: object
    drafter: object
    backend: RemoteBackend
    sink: DeltaCollector


def _start_pair(name: str, mode: str, draft: bool, prefill_chunk: int | None = None) -> Pair:
    target, draft_dir = demo_pair_dirs()
    drafter_name = f"{name}.drafter"
    drafter = create_drafter(
        drafter_name,
        DrafterSpec(
            draft_dir=str(draft_dir) if draft else None,
            dtype="float32",
            max_batch_size=8,
            num_threads=1,
        ),
        Placement(DRAFTER_NODE, max_restarts=-1),
    )
    verifier = create_verifier(
        f"{name}.verifier",
        VerifierSpec(
            target_dir=str(target),
            dtype="float32",
            max_batch_size=8,
            num_speculative_tokens=4,
            proposer="remote",
            drafter_actor=drafter_name,
            mode=mode,  # type: ignore[arg-type]
            num_threads=1,
            prefill_chunk_tokens=prefill_chunk,
        ),
        Placement(VERIFIER_NODE),
    )
    model = served_model(verifier, "demo", timeout_s=LOAD_TIMEOUT_S)
    sink = DeltaCollector()
    backend = RemoteBackend(verifier, model, actor_name=f"{name}.verifier")
    backend.start(sink)
    return Pair(name, verifier, drafter, backend, sink)


def _stop_pair(pair: Pair) -> None:
    pair.backend.stop()
    kill_actor(f"{pair.name}.verifier")
    kill_actor(f"{pair.name}.drafter")


@pytest.fixture(scope="module")
def pairs(cluster: TestCluster) -> Iterator[dict[str, Pair]]:
    started: dict[str, Pair] = {}
    try:
        started["sync"] = _start_pair("split-sync", "sync", draft=True)
        # prompts joining a decoding batch go in PREFILL_CHUNK tokens a step
        started["overlapped"] = _start_pair(
            "split-overlapped", "overlapped", draft=True, prefill_chunk=PREFILL_CHUNK
        )
        started["ngram"] = _start_pair("split-ngram", "overlapped", draft=False)
        yield started
    finally:
        for pair in started.values():
            _stop_pair(pair)


@pytest.fixture(scope="module")
def prompts(pairs: dict[str, Pair]) -> list[list[int]]:
    tokenizer = pairs["sync"].backend.model.tokenizer
    return [tokenizer.encode(text) for text in TEXTS]


@pytest.fixture(scope="module")
def reference(prompts: list[list[int]]) -> list[list[int]]:
    target, _ = demo_pair_dirs()
    engine = make_engine(target, batch=8, max_model_len=None, dtype="float32")
    return [o.token_ids for o in run_greedy(engine, prompts, MAX_TOKENS)]


def _params(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _run(pair: Pair, prompts: list[list[int]], tag: str, together: bool = True) -> list[list[int]]:
    """Greedy outputs of `prompts` through the pair: all at once (a ragged batch), or one at
    a time (batch 1)."""
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    if together:
        for rid, prompt in zip(ids, prompts, strict=True):
            pair.backend.submit(Request(rid, prompt, _params()))
        pair.sink.wait_finished(ids, timeout_s=FINISH_TIMEOUT_S)
    else:
        for rid, prompt in zip(ids, prompts, strict=True):
            pair.backend.submit(Request(rid, prompt, _params()))
            pair.sink.wait_finished([rid], timeout_s=FINISH_TIMEOUT_S)
    return [pair.sink.tokens(rid) for rid in ids]


def _drafted(pair: Pair) -> int:
    return sum(r.num_draft_tokens for o in pair.sink.outputs for r in o.rounds)


def test_drafter_and_verifier_run_on_different_nodes(pairs: dict[str, Pair]) -> None:
    for pair in pairs.values():
        verifier = ray.get(pair.verifier.status.remote(), timeout=30)
        # the fixture waits for the verifier to serve, not for the drafter: its load runs in
        # the background (an n-gram drafter's too), and on a loaded machine it was still
        # "loading" when this read its status
        drafter = ray.get(
            pair.drafter.wait_ready.remote(LOAD_TIMEOUT_S), timeout=LOAD_TIMEOUT_S + 30
        )
        assert (verifier.node_name, drafter.node_name) == (VERIFIER_NODE, DRAFTER_NODE)
        assert verifier.node_id != drafter.node_id
        assert drafter.state == "ready", drafter.error


@pytest.mark.parametrize("mode", ["sync", "overlapped"])
def test_greedy_equals_target_only_batch1_and_ragged8(
    pairs: dict[str, Pair], prompts: list[list[int]], reference: list[list[int]], mode: str
) -> None:
    pair = pairs[mode]
    before = _drafted(pair)
    assert _run(pair, prompts[:3], f"b1-{mode}", together=False) == reference[:3]
    assert _run(pair, prompts, f"b8-{mode}") == reference
    assert _drafted(pair) > before  # the drafts came from the drafter node
    batch_sizes = [r.batch_size for o in pair.sink.outputs for r in o.rounds]
    assert max(batch_sizes) > 1


@pytest.mark.parametrize("mode", ["sync", "overlapped"])
def test_adaptive_k_is_lossless(
    pairs: dict[str, Pair], prompts: list[list[int]], reference: list[list[int]], mode: str
) -> None:
    pair = pairs[mode]
    ray.get(pair.verifier.set_speculation.remote(6, True), timeout=120)
    try:
        assert _run(pair, prompts, f"adaptive-{mode}") == reference
    finally:
        ray.get(pair.verifier.set_speculation.remote(4, False), timeout=120)


def test_chunked_prefill_beside_a_decoding_request_is_lossless(
    pairs: dict[str, Pair], prompts: list[list[int]], reference: list[list[int]]
) -> None:
    """The overlapped pair's verifier prefills PREFILL_CHUNK prompt tokens a step while others
    decode: prompts that join a long request's decoding go in over several rounds, with
    drafts from the drafter node between them, and every output is target-only's."""
    pair = pairs["overlapped"]
    seen = len(pair.sink.outputs)
    long_ids = [f"chunk-long-{i}" for i in range(2)]
    long_ref = target_only_outputs(prompts[:1], max_tokens=200)[0]
    for rid in long_ids:
        pair.backend.submit(Request(rid, prompts[0], _params(200)))
    deadline = time.monotonic() + FINISH_TIMEOUT_S
    while not pair.sink.tokens(long_ids[-1]):
        assert time.monotonic() < deadline, "the long requests never started"
        time.sleep(0.01)
    ids = [f"chunk-{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts, strict=True):
        pair.backend.submit(Request(rid, prompt, _params()))
    pair.sink.wait_finished(long_ids + ids, timeout_s=FINISH_TIMEOUT_S)
    assert [pair.sink.tokens(rid) for rid in ids] == reference
    assert all(pair.sink.tokens(rid) == long_ref for rid in long_ids)
    rounds = [r for o in pair.sink.outputs[seen:] for r in o.rounds]
    prefills = [r.num_prefill_tokens for r in rounds if r.num_prefill_tokens]
    # each long request's prompt went in whole (nothing decoded yet), or beside the other's
    assert max(prefills[2:]) <= PREFILL_CHUNK
    assert sum(prefills) == 2 * len(prompts[0]) + sum(len(p) for p in prompts)
    assert len(prefills) > 2 + len(prompts)  # some prompt took several steps


def test_ngram_drafter_is_lossless(pairs: dict[str, Pair], prompts: list[list[int]]) -> None:
    repetitive = [p * 3 for p in prompts[:4]]  # so that lookups find something
    target, _ = demo_pair_dirs()
    engine = make_engine(target, batch=8, max_model_len=None, dtype="float32")
    expected = [o.token_ids for o in run_greedy(engine, repetitive, MAX_TOKENS)]
    pair = pairs["ngram"]
    assert _run(pair, repetitive, "ngram") == expected
    assert _drafted(pair) > 0


def _drafted_after(pair: Pair, index: int) -> int:
    return sum(r.num_draft_tokens for o in pair.sink.outputs[index:] for r in o.rounds)


def _long_requests(pair: Pair, prompts: list[list[int]], tag: str) -> list[str]:
    ids = [f"{tag}-{i}" for i in range(4)]
    for rid, prompt in zip(ids, prompts[:4], strict=True):
        pair.backend.submit(Request(rid, prompt, _params(max_tokens=400)))
    return ids


def _wait_restarted(handle: Any, timeout_s: float) -> None:
    """Wait until a killed actor's restarted instance is loaded. Ray refuses calls while the
    actor restarts (`ActorUnavailableError`): the requests can finish at k = 0 before the new
    process is up, on a loaded machine in particular, so ask again until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            ray.get(handle.wait_ready.remote(max(left, 1.0)), timeout=max(left, 1.0) + 30)
            return
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _wait_for_drafts(pair: Pair, since: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _drafted_after(pair, since) > 0:
            return True
        time.sleep(0.2)
    return False


def _traffic_until_drafts(
    pair: Pair, prompts: list[list[int]], tag: str, timeout_s: float
) -> tuple[list[str], bool]:
    """Batches of long requests, one after another, until a round carries drafts (the verifier
    probes a lost drafter only while it runs rounds, at most once a second, so a batch may
    finish at k = 0 before a probe finds the drafter back) or `timeout_s` passes: (the ids
    submitted, whether drafts came)."""
    since, ids = len(pair.sink.outputs), []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = _long_requests(pair, prompts, f"{tag}-{len(ids) // 4}")
        ids += batch
        while time.monotonic() < deadline and not pair.sink.finished(batch):
            if _drafted_after(pair, since) > 0:
                return ids, True
            time.sleep(0.2)
        if _drafted_after(pair, since) > 0:
            return ids, True
    return ids, False


def _reference_long(prompts: list[list[int]]) -> list[list[int]]:
    target, _ = demo_pair_dirs()
    engine = make_engine(target, batch=8, max_model_len=None, dtype="float32")
    return [o.token_ids for o in run_greedy(engine, prompts[:4], 400)]


def test_drafter_killed_mid_generation_costs_speculation_not_tokens(
    pairs: dict[str, Pair], prompts: list[list[int]]
) -> None:
    """Ray restarts the killed drafter (max_restarts -1); meanwhile rounds run at k = 0 and
    the requests finish with the target-only output; drafting resumes on the new instance."""
    pair = pairs["overlapped"]
    ids = _long_requests(pair, prompts, "killed")
    assert _wait_for_drafts(pair, len(pair.sink.outputs), 30)
    first = ray.get(pair.drafter.status.remote(), timeout=30)
    ray.kill(pair.drafter, no_restart=False)
    pair.sink.wait_finished(ids, timeout_s=FINISH_TIMEOUT_S * 2)
    assert [pair.sink.tokens(rid) for rid in ids] == _reference_long(prompts)
    assert all(pair.sink.last(rid).finish_reason == "length" for rid in ids)
    # a restarted drafter (a new process) serves again: speculation resumes
    _wait_restarted(pair.drafter, LOAD_TIMEOUT_S)
    again, resumed = _traffic_until_drafts(pair, prompts, "after-restart", 60)
    assert resumed, "speculation did not resume"
    pair.sink.wait_finished(again, timeout_s=FINISH_TIMEOUT_S * 2)
    second = ray.get(pair.drafter.status.remote(), timeout=30)
    assert second.pid != first.pid and second.instance_id != first.instance_id


def test_drafter_gone_for_good_then_recreated_elsewhere(
    pairs: dict[str, Pair], prompts: list[list[int]]
) -> None:
    """The drafter is killed with no restart (its node lost, say): requests complete at k = 0;
    a new drafter under the same name on another node (what `apply` does when it re-places
    it) is found by name and drafting resumes."""
    pair = pairs["sync"]
    ids = _long_requests(pair, prompts, "gone")
    assert _wait_for_drafts(pair, len(pair.sink.outputs), 30)
    kill_actor(f"{pair.name}.drafter")
    pair.sink.wait_finished(ids, timeout_s=FINISH_TIMEOUT_S * 2)
    assert [pair.sink.tokens(rid) for rid in ids] == _reference_long(prompts)
    _, draft_dir = demo_pair_dirs()
    pair.drafter = create_drafter(
        f"{pair.name}.drafter",
        DrafterSpec(draft_dir=str(draft_dir), dtype="float32", max_batch_size=8, num_threads=1),
        Placement(VERIFIER_NODE, max_restarts=-1),
    )
    status = ray.get(pair.drafter.wait_ready.remote(LOAD_TIMEOUT_S), timeout=LOAD_TIMEOUT_S + 30)
    assert status.state == "ready" and status.node_name == VERIFIER_NODE
    again, resumed = _traffic_until_drafts(pair, prompts, "recreated", 60)
    assert resumed, "speculation did not resume"
    pair.sink.wait_finished(again, timeout_s=FINISH_TIMEOUT_S * 2)
    reference = _reference_long(prompts)
    assert all(pair.sink.tokens(rid) == reference[i % 4] for i, rid in enumerate(again))
