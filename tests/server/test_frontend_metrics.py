"""The frontend over a real LocalBackend (tiny models, engine loop thread) without HTTP: deltas
reach their groups, Prometheus series and the per-second snapshot add up."""

import asyncio
import logging
import time
from pathlib import Path

import pytest

from daemon.runtime.engine.builder import EngineSpec, build_engine
from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.request import Request, RequestDelta
from daemon.runtime.sampling.params import SamplingParams
from specctl.server.frontend import Frontend, RequestGroup
from specctl.server.local_backend import LocalBackend
from specctl.server.metrics import ServerMetrics
from specctl.server.serve_log import StatsLogger
from specctl.server.snapshot import MetricsSnapshot, SnapshotRecorder, percentile
from tests.tiny_models import make_tiny_checkpoint

MAX_TOKENS = 24
NUM_REQUESTS = 4


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> LocalBackend:
    root = tmp_path_factory.mktemp("frontend")
    target = make_tiny_checkpoint(root / "target", seed=0)
    # the draft is the target itself: every greedy draft is accepted
    spec = EngineSpec(
        target=target,
        draft=target,
        max_model_len=128,
        engine=EngineConfig(max_batch_size=NUM_REQUESTS, num_speculative_tokens=3),
    )
    return LocalBackend(build_engine(spec), "tiny")


async def _drain(frontend: Frontend, group: RequestGroup) -> list[RequestDelta]:
    return [delta async for _, delta in group.deltas(frontend.idle_timeout_s)]


def test_frontend_routes_deltas_and_counts_them(
    backend: LocalBackend, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = ServerMetrics("tiny")
    snapshots = SnapshotRecorder()
    seen: list[MetricsSnapshot] = []
    snapshots.add_listener(lambda s: 1 / 0)  # a broken listener does not stop the others
    snapshots.add_listener(seen.append)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)

    async def scenario() -> list[list[RequestDelta]]:
        frontend = Frontend(backend, [metrics, snapshots])
        await frontend.start()
        try:
            groups = [
                await frontend.submit([Request(f"r{i}", [3 + i, 7, 11], params)])
                for i in range(NUM_REQUESTS)
            ]
            return list(await asyncio.gather(*(_drain(frontend, g) for g in groups)))
        finally:
            await frontend.stop()

    per_request = asyncio.run(scenario())
    for deltas in per_request:
        assert sum(len(d.new_token_ids) for d in deltas) == MAX_TOKENS
        assert deltas[-1].finish_reason == "length"
    snap = snapshots.tick()
    assert seen == [snap]
    assert snap.num_generated_tokens == NUM_REQUESTS * MAX_TOKENS
    assert snap.num_finished_requests == NUM_REQUESTS
    assert snap.max_batch_size > 1 and snap.speculation_len == 3
    assert snap.acceptance_rate == 1.0 and snap.acceptance_rate_per_pos[0] == 1.0
    assert snap.mean_acceptance_length is not None and snap.mean_acceptance_length > 3.0
    assert snap.ttft_p50_s is not None and snap.itl_p99_s is not None
    with caplog.at_level(logging.INFO, logger="specctl.serve"):
        StatsLogger(interval_s=0.0)(snap)
    assert "tokens/s, running 0, waiting 0" in caplog.text and "acceptance 1.00" in caplog.text

    text = metrics.exposition().decode()
    label = 'model_name="tiny"'
    assert f"vllm:generation_tokens_total{{{label}}} {float(NUM_REQUESTS * MAX_TOKENS)}" in text
    assert f"vllm:prompt_tokens_total{{{label}}} {float(NUM_REQUESTS * 3)}" in text
    assert f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{label},position="2"}}' in text
    assert f"vllm:num_requests_running{{{label}}} 0.0" in text
    assert f"vllm:time_to_first_token_seconds_count{{{label}}} {float(NUM_REQUESTS)}" in text
    itl_count = NUM_REQUESTS * MAX_TOKENS - sum(len(d[0].new_token_ids) for d in per_request)
    assert f"vllm:inter_token_latency_seconds_count{{{label}}} {float(itl_count)}" in text
    assert 'specctl:batch_size_bucket{le="1.0",' in text


def test_a_second_registry_does_not_share_series() -> None:
    first, second = ServerMetrics("a"), ServerMetrics("a")
    first.on_tokens(2, 0.01)
    assert 'vllm:generation_tokens_total{model_name="a"} 2.0' in first.exposition().decode()
    assert 'vllm:generation_tokens_total{model_name="a"} 0.0' in second.exposition().decode()


def test_percentile() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert 99.0 <= (percentile(values, 99) or 0) <= 100.0


def test_empty_interval_snapshot() -> None:
    snap = SnapshotRecorder().tick()
    assert snap.num_rounds == 0 and snap.tokens_per_s == 0.0
    assert snap.acceptance_rate is None and snap.ttft_p50_s is None


def test_submit_of_a_bad_request_raises_and_leaves_nothing(backend: LocalBackend) -> None:
    from daemon.runtime.errors import RequestError

    async def scenario() -> int:
        frontend = Frontend(backend, [])
        await frontend.start()
        try:
            good = Request("ok", [5, 6], SamplingParams(max_tokens=200, ignore_eos=True))
            bad = Request("bad", [], SamplingParams())
            with pytest.raises(RequestError):
                await frontend.submit([good, bad])  # the first is aborted again
            await asyncio.sleep(0.5)
            return frontend.num_open_requests
        finally:
            await frontend.stop()

    assert asyncio.run(scenario()) == 0


def test_a_request_queued_longer_than_the_idle_timeout_is_served(tmp_path: Path) -> None:
    """One sequence at a time, twelve requests of 500 tokens: the last waits for eleven others,
    far past an idle timeout of 0.1 s, with no delta of its own. Only an engine that gave
    nobody a delta for that long is stuck; a request waiting its turn was given up as stuck
    before (a 500)."""
    target = make_tiny_checkpoint(tmp_path / "target", seed=0)
    spec = EngineSpec(  # plain decoding: a step per token
        target=target,
        max_model_len=512,
        engine=EngineConfig(max_batch_size=1, num_speculative_tokens=0),
    )
    backend = LocalBackend(build_engine(spec), "tiny")
    params = SamplingParams(temperature=0.0, max_tokens=500, ignore_eos=True)
    idle_timeout_s = 0.1

    async def drain(
        frontend: Frontend, group: RequestGroup, submitted: float
    ) -> tuple[list[RequestDelta], float]:
        """The group's deltas, and how long after its submission its first token came."""
        deltas: list[RequestDelta] = []
        waited = None
        async for _, delta in group.deltas(idle_timeout_s, lambda: frontend.last_output_s):
            if waited is None and delta.new_token_ids:
                waited = time.monotonic() - submitted
            deltas.append(delta)
        assert waited is not None
        return deltas, waited

    async def scenario() -> list[tuple[list[RequestDelta], float]]:
        frontend = Frontend(backend, [], idle_timeout_s=idle_timeout_s)
        await frontend.start()
        try:
            drains = []
            for i in range(12):
                group = await frontend.submit([Request(f"q{i}", [3 + i, 7, 11], params)])
                drains.append(drain(frontend, group, time.monotonic()))
            return list(await asyncio.gather(*drains))
        finally:
            await frontend.stop()

    done = asyncio.run(scenario())
    assert done[-1][1] > 3 * idle_timeout_s  # the case this is about did happen
    for deltas, _ in done:
        assert sum(len(d.new_token_ids) for d in deltas) == 500
        assert deltas[-1].finish_reason == "length"
