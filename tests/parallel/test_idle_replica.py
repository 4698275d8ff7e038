"""Two data-parallel replicas, each a verifier split over two tensor-parallel ranks: while one
replica decodes a long request, the other gets nothing for longer than its group's collective
timeout. The busy one never stalls (bounded gap between its outputs), and the idle one, kept
alive by its leader's heartbeat, then serves correctly: an idle rank never blocks or breaks
anyone."""

import itertools
import time
from collections.abc import Iterator

import pytest

from daemon.runtime.engine.request import Request
from daemon.shard.specs import RankSpec, VerifierSpec
from specctl.demo_pair import demo_pair_dirs
from specctl.deploy.actors import Placement, create_verifier, kill_actor, rank_name, start_ranks
from specctl.deploy.remote_backend import RemoteBackend, served_model
from tests.distributed.ray_cluster import TestCluster
from tests.distributed.workload import TEXTS, greedy, target_only
from tests.engine.helpers import DeltaCollector
from tests.parallel.conftest import DRAFTER_NODE, VERIFIER_NODE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

GROUP_TIMEOUT_S = 6.0  # the idle replica waits longer than this: only heartbeats keep it up
IDLE_S = 2 * GROUP_TIMEOUT_S
MAX_GAP_S = 3.0  # between two outputs of the busy replica
NAMES = ["dp-tp-0", "dp-tp-1"]


class TimedSink(DeltaCollector):
    """Also records when each output arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[tuple[float, set[str]]] = []

    def __call__(self, output) -> None:  # type: ignore[no-untyped-def]
        self.arrivals.append((time.monotonic(), {d.request_id for d in output.deltas}))
        super().__call__(output)


@pytest.fixture(scope="module")
def replicas(cluster: TestCluster) -> Iterator[list[tuple[RemoteBackend, TimedSink]]]:
    target, _ = demo_pair_dirs()
    started = []
    try:
        for name, node in zip(NAMES, (VERIFIER_NODE, DRAFTER_NODE), strict=True):
            spec = VerifierSpec(
                target_dir=str(target), dtype="float32", max_batch_size=4, num_threads=1,
                tensor_parallel_size=2, tp_timeout_s=GROUP_TIMEOUT_S,
            )  # fmt: skip
            handle = create_verifier(name, spec, Placement(node))
            template = RankSpec(
                str(target), rank=0, size=2, address="", num_slots=4, dtype="float32",
                timeout_s=GROUP_TIMEOUT_S, num_threads=1,
            )  # fmt: skip
            start_ranks(name, handle, template, Placement(node))
            model = served_model(handle, "demo", timeout_s=180)
            sink = TimedSink()
            backend = RemoteBackend(handle, model, actor_name=name)
            backend.start(sink)
            started.append((backend, sink))
        yield started
    finally:
        for backend, _ in started:
            backend.stop()
        for name in NAMES:
            kill_actor(name)
        assert all(kill_actor(rank_name(name, 1)) is False for name in NAMES)


def test_busy_replica_never_stalls_and_idle_one_serves_after(replicas) -> None:
    (busy, busy_sink), (idle, idle_sink) = replicas
    tokenizer = busy.model.tokenizer
    prompts = [tokenizer.encode(text) for text in TEXTS[:2]]
    reference = target_only(prompts, 4)
    busy.submit(Request("long", prompts[0], greedy(100_000)))
    start = time.monotonic()
    while time.monotonic() - start < IDLE_S:  # the other replica gets nothing meanwhile
        time.sleep(0.5)
    arrivals = [t for t, ids in busy_sink.arrivals if "long" in ids and t >= start]
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert len(arrivals) > 10 and max(gaps) < MAX_GAP_S, (len(arrivals), max(gaps, default=0))
    idle.submit(Request("late", prompts[1], greedy()))
    idle_sink.wait_finished(["late"], timeout_s=60)
    assert idle_sink.last("late").finish_reason == "length"
    assert idle_sink.tokens("late") == reference[1]
    busy.abort("long")
    busy_sink.wait_finished(["long"], timeout_s=30)
    assert busy_sink.tokens("long")[:24] == reference[0]
