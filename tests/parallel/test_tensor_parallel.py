"""Tensor-parallel shards on a real two-node Ray cluster: a TP = 2 verifier (two rank actors on
one node) and a TP = 2 drafter (two rank actors on the other), each group driven by its rank 0.
Greedy output equals target-only decoding with every sequence drafting, with k = 0 for every
sequence (rounds that draft nothing), with adaptive k (some sequences drafting, some not) and
with ragged lengths (finished sequences drop out); a killed rank ends its shard's requests with
an error within the group's timeout instead of hanging."""

import time
from collections.abc import Iterator

import pytest
import ray

from daemon.runtime.engine.request import Request
from daemon.shard.specs import DrafterSpec, RankSpec, VerifierSpec
from specctl.demo_pair import demo_pair_dirs
from specctl.deploy.actors import (
    Placement,
    create_drafter,
    create_verifier,
    kill_actor,
    rank_name,
    start_ranks,
)
from tests.distributed.ray_cluster import TestCluster
from tests.distributed.workload import MAX_TOKENS, TEXTS, Served, greedy, target_only
from tests.parallel.conftest import DRAFTER_NODE, VERIFIER_NODE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LOAD_TIMEOUT_S = 180.0
GROUP_TIMEOUT_S = 15.0  # every collective of a group; the bound on noticing a lost rank
BATCH = 8


def _rank_template(model_dir: str) -> RankSpec:
    return RankSpec(
        model_dir, rank=0, size=2, address="", num_slots=BATCH, dtype="float32",
        timeout_s=GROUP_TIMEOUT_S, num_threads=1,
    )  # fmt: skip


def _start(name: str, *, with_drafter: bool) -> Served:
    target, draft = demo_pair_dirs()
    names: list[str] = []
    drafter_name = f"{name}.drafter"
    if with_drafter:
        drafter = create_drafter(
            drafter_name,
            DrafterSpec(
                draft_dir=str(draft), dtype="float32", max_batch_size=BATCH, num_threads=1,
                tensor_parallel_size=2, tp_timeout_s=GROUP_TIMEOUT_S,
            ),
            Placement(DRAFTER_NODE),
        )  # fmt: skip
        start_ranks(drafter_name, drafter, _rank_template(str(draft)), Placement(DRAFTER_NODE))
        names += [drafter_name, rank_name(drafter_name, 1)]
    verifier_name = f"{name}.verifier"
    verifier = create_verifier(
        verifier_name,
        VerifierSpec(
            target_dir=str(target), dtype="float32", max_batch_size=BATCH,
            num_speculative_tokens=4 if with_drafter else 0,
            proposer="remote" if with_drafter else "none",
            drafter_actor=drafter_name if with_drafter else None,
            num_threads=1, tensor_parallel_size=2, tp_timeout_s=GROUP_TIMEOUT_S,
        ),
        Placement(VERIFIER_NODE),
    )  # fmt: skip
    start_ranks(verifier_name, verifier, _rank_template(str(target)), Placement(VERIFIER_NODE))
    names += [verifier_name, rank_name(verifier_name, 1)]
    return Served.start(verifier, verifier_name, names, LOAD_TIMEOUT_S)


@pytest.fixture(scope="module")
def speculative(cluster: TestCluster) -> Iterator[Served]:
    shards = _start("tp-spec", with_drafter=True)
    try:
        yield shards
    finally:
        shards.stop()


@pytest.fixture(scope="module")
def prompts(speculative: Served) -> list[list[int]]:
    tokenizer = speculative.backend.model.tokenizer
    return [tokenizer.encode(text) for text in TEXTS]


@pytest.fixture(scope="module")
def reference(prompts: list[list[int]]) -> list[list[int]]:
    return target_only(prompts, BATCH)


def test_ranks_share_their_shards_node(speculative: Served) -> None:
    for name in speculative.names:
        if ".rank" not in name:
            continue
        handle = ray.get_actor(name, namespace="specctl")
        status = ray.get(handle.status.remote(), timeout=30)
        node = DRAFTER_NODE if name.startswith("tp-spec.drafter") else VERIFIER_NODE
        assert (status["state"], status["node_name"]) == ("ready", node), status


def test_tp2_drafter_and_verifier_greedy_equals_target_only(
    speculative: Served, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    before = len(speculative.sink.outputs)
    assert speculative.run(prompts, "all") == reference
    assert speculative.drafted(before) > 0  # the TP drafter drafted, the TP verifier judged


def test_ragged_lengths_finished_sequences_drop_out(
    speculative: Served, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    lengths = [3, MAX_TOKENS, 1, 11, MAX_TOKENS, 6, 17, 2]
    outputs = speculative.run(prompts, "ragged", lengths)
    assert outputs == [ref[:n] for ref, n in zip(reference, lengths, strict=True)]


def test_k0_for_every_sequence_is_lossless(
    speculative: Served, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    ray.get(speculative.verifier.set_speculation.remote(0, False), timeout=120)
    try:
        before = len(speculative.sink.outputs)
        assert speculative.run(prompts, "k0") == reference
        assert speculative.drafted(before) == 0  # nobody drafted, the groups kept in step
    finally:
        ray.get(speculative.verifier.set_speculation.remote(4, False), timeout=120)


ADAPTIVE_TOKENS = 96  # enough left that starting to draft can pay for the drafter's prompts


def test_adaptive_some_sequences_draft_is_lossless(
    speculative: Served, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    """Adaptive k decides per round which sequences draft; the requests are long enough that
    feeding the remote drafter their prompts is worth it (controller.py: at 24 tokens each
    the one-off price of starting, spread over what is left, ate the gain). The controller
    starts from no measured costs, as a new engine's does: with the costs the fixed-k tests
    before it measured on a loaded machine, plain decoding could win every round (a choice,
    not a fault), and whether any round drafted was chance; from nothing, its first round
    drafts at the ceiling and its second measures plain decoding."""
    longer = target_only(prompts, BATCH, ADAPTIVE_TOKENS)
    ray.get(speculative.verifier.set_speculation.remote(6, True, True), timeout=120)
    try:
        before = len(speculative.sink.outputs)
        outputs = speculative.run(prompts, "adaptive", [ADAPTIVE_TOKENS] * len(prompts))
        assert outputs == longer
        rounds = [r for o in speculative.sink.outputs[before:] for r in o.rounds]
        assert any(r.num_draft_tokens > 0 for r in rounds)
    finally:
        ray.get(speculative.verifier.set_speculation.remote(4, False), timeout=120)
    assert speculative.run(prompts[:2], "after-adaptive") == reference[:2]


def test_killed_rank_fails_requests_within_the_group_timeout(
    cluster: TestCluster, prompts: list[list[int]]
) -> None:
    shards = _start("tp-fault", with_drafter=False)
    try:
        ids = [f"fault-{i}" for i in range(4)]
        for rid, prompt in zip(ids, prompts[:4], strict=True):
            shards.backend.submit(Request(rid, prompt, greedy(400)))
        deadline = time.monotonic() + 60
        while not all(shards.sink.tokens(rid) for rid in ids) and time.monotonic() < deadline:
            time.sleep(0.1)
        killed_at = time.monotonic()
        assert kill_actor(rank_name("tp-fault.verifier", 1))
        shards.sink.wait_finished(ids, timeout_s=GROUP_TIMEOUT_S + 15)
        took = time.monotonic() - killed_at
        for rid in ids:
            last = shards.sink.last(rid)
            assert last.finish_reason == "error", last
            assert "tensor-parallel group" in (last.error or ""), last.error
        assert took < GROUP_TIMEOUT_S + 15
        # the shard reports itself failed, naming the group, and refuses new work as stopped
        # (a router sends it to another replica) instead of hanging
        status = ray.get(shards.verifier.status.remote(), timeout=30)
        assert status.state == "failed" and "tensor-parallel group" in (status.error or "")
        refused = ray.get(shards.verifier.submit.remote(Request("late", prompts[0], greedy(4))))
        assert (refused.accepted, refused.kind) == (False, "stopped"), refused
    finally:
        shards.stop()
