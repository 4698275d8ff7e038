"""A pipeline-parallel verifier across two Ray nodes with an uneven split (layers 0-3 with the
embedding on one node, layers 4-5 with the LM head on another) and its drafter on a third:
greedy output equals target-only decoding (ragged batch, fixed and adaptive k, k = 0), and a
killed stage ends the verifier's requests with an error naming the stage, within its timeout."""

import time
from collections.abc import Iterator

import pytest
import ray

from daemon.runtime.engine.request import Request
from daemon.shard.specs import DrafterSpec, StageSpec, VerifierSpec
from specctl.demo_pair import demo_pair_dirs
from specctl.deploy.actors import (
    Placement,
    create_drafter,
    create_stage,
    create_verifier,
    kill_actor,
)
from tests.distributed.ray_cluster import TestCluster
from tests.distributed.workload import TEXTS, Served, greedy, target_only
from tests.parallel.conftest import DRAFTER_NODE, STAGE_NODE, VERIFIER_NODE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LOAD_TIMEOUT_S = 180.0
STAGE_TIMEOUT_S = 15.0
SPLIT = 4  # of the demo target's 6 layers: 4 on the verifier's node, 2 on the stage's
BATCH = 8


def _start(name: str, *, with_drafter: bool) -> Served:
    target, draft = demo_pair_dirs()
    names = []
    stage_name = f"{name}.stage1"
    create_stage(
        stage_name,
        StageSpec(str(target), (SPLIT, 6), num_slots=BATCH, dtype="float32", num_threads=1),
        Placement(STAGE_NODE),
    )
    names.append(stage_name)
    drafter_name = f"{name}.drafter"
    if with_drafter:
        create_drafter(
            drafter_name,
            DrafterSpec(draft_dir=str(draft), dtype="float32", max_batch_size=BATCH, num_threads=1),
            Placement(DRAFTER_NODE),
        )
        names.append(drafter_name)
    verifier_name = f"{name}.verifier"
    verifier = create_verifier(
        verifier_name,
        VerifierSpec(
            target_dir=str(target), dtype="float32", max_batch_size=BATCH,
            num_speculative_tokens=4 if with_drafter else 0,
            proposer="remote" if with_drafter else "none",
            drafter_actor=drafter_name if with_drafter else None, num_threads=1,
            layers=(0, SPLIT), pipeline_stages=[stage_name], stage_timeout_s=STAGE_TIMEOUT_S,
        ),
        Placement(VERIFIER_NODE),
    )  # fmt: skip
    names.append(verifier_name)
    return Served.start(verifier, verifier_name, names, LOAD_TIMEOUT_S)


@pytest.fixture(scope="module")
def pipeline(cluster: TestCluster) -> Iterator[Served]:
    started = _start("pp", with_drafter=True)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def prompts(pipeline: Served) -> list[list[int]]:
    tokenizer = pipeline.backend.model.tokenizer
    return [tokenizer.encode(text) for text in TEXTS]


@pytest.fixture(scope="module")
def reference(prompts: list[list[int]]) -> list[list[int]]:
    return target_only(prompts, BATCH)


def test_stages_run_on_their_nodes(pipeline: Served) -> None:
    stage = ray.get_actor("pp.stage1", namespace="specctl")
    status = ray.get(stage.status.remote(), timeout=30)
    verifier = ray.get(pipeline.verifier.status.remote(), timeout=30)
    assert (status.node_name, verifier.node_name) == (STAGE_NODE, VERIFIER_NODE)
    assert status.node_id != verifier.node_id and status.state == "ready"


@pytest.mark.parametrize(("k", "adaptive"), [(4, False), (6, True), (0, False)])
def test_pipeline_greedy_equals_target_only(
    pipeline: Served,
    prompts: list[list[int]],
    reference: list[list[int]],
    k: int,
    adaptive: bool,
) -> None:
    ray.get(pipeline.verifier.set_speculation.remote(k, adaptive), timeout=120)
    try:
        before = len(pipeline.sink.outputs)
        assert pipeline.run(prompts, f"k{k}-{adaptive}") == reference
        assert (pipeline.drafted(before) > 0) == (k > 0)
    finally:
        ray.get(pipeline.verifier.set_speculation.remote(4, False), timeout=120)


def test_killed_stage_fails_requests_naming_it(
    cluster: TestCluster, prompts: list[list[int]]
) -> None:
    started = _start("pp-fault", with_drafter=False)
    try:
        ids = [f"fault-{i}" for i in range(4)]
        for rid, prompt in zip(ids, prompts[:4], strict=True):
            started.backend.submit(Request(rid, prompt, greedy(400)))
        deadline = time.monotonic() + 60
        while not all(started.sink.tokens(rid) for rid in ids) and time.monotonic() < deadline:
            time.sleep(0.1)
        killed_at = time.monotonic()
        assert kill_actor("pp-fault.stage1")
        started.sink.wait_finished(ids, timeout_s=STAGE_TIMEOUT_S + 15)
        assert time.monotonic() - killed_at < STAGE_TIMEOUT_S + 15
        for rid in ids:
            last = started.sink.last(rid)
            assert last.finish_reason == "error", last
            assert f"stage 1 on {STAGE_NODE} is down" in (last.error or ""), last.error
        status = ray.get(started.verifier.status.remote(), timeout=30)
        assert status.state == "failed" and "stage 1" in (status.error or "")
    finally:
        started.stop()
