"""The verifier shard's process is killed mid-generation: its requests end with a clear error
within a bounded time (no hang), and the shard Ray restarts serves new requests."""

import os
import signal
import time

import pytest
import ray

from daemon.runtime.engine.request import Request
from daemon.runtime.errors import EngineStoppedError
from daemon.runtime.sampling.params import SamplingParams
from daemon.shard.specs import VerifierSpec
from specctl.demo_pair import demo_pair_dirs
from specctl.deploy.actors import Placement, create_verifier, kill_actor
from specctl.deploy.remote_backend import RemoteBackend, served_model
from tests.distributed.conftest import VERIFIER_NODE
from tests.engine.helpers import DeltaCollector

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NAME = "test-verifier-faults"
LOAD_TIMEOUT_S = 180.0
ERROR_BOUND_S = 30.0  # requests of a dead verifier must end within this


def test_killed_verifier_ends_its_requests_then_restarts(cluster) -> None:
    target, _ = demo_pair_dirs()
    spec = VerifierSpec(target_dir=str(target), dtype="float32", max_batch_size=4, num_threads=1)
    handle = create_verifier(NAME, spec, Placement(VERIFIER_NODE, max_restarts=1))
    try:
        model = served_model(handle, "demo", timeout_s=LOAD_TIMEOUT_S)
        sink = DeltaCollector()
        backend = RemoteBackend(handle, model, call_timeout_s=10.0)
        backend.start(sink)
        try:
            endless = SamplingParams(max_tokens=100_000, ignore_eos=True)
            prompt = model.tokenizer.encode("def main():")
            ids = ["a", "b"]
            for rid in ids:
                backend.submit(Request(rid, prompt, endless))
            _wait_for_tokens(sink, ids)
            pid = ray.get(handle.status.remote(), timeout=30).pid
            killed_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)

            sink.wait_finished(ids, timeout_s=ERROR_BOUND_S)
            assert time.monotonic() - killed_at < ERROR_BOUND_S
            for rid in ids:
                last = sink.last(rid)
                assert last.finish_reason == "error"
                assert "verifier shard" in (last.error or "")

            # Ray restarts the shard (max_restarts=1); once loaded it serves again
            served = _submit_when_ready(
                backend, Request("after", prompt, SamplingParams(max_tokens=4))
            )
            assert served
            sink.wait_finished(["after"], timeout_s=60)
            assert sink.last("after").finish_reason in {"length", "stop"}
            assert len(sink.tokens("after")) >= 1
            assert ray.get(handle.status.remote(), timeout=30).pid != pid
        finally:
            backend.stop()
    finally:
        kill_actor(NAME)


def _wait_for_tokens(sink: DeltaCollector, ids: list[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(len(sink.tokens(rid)) >= 3 for rid in ids):
        assert time.monotonic() < deadline, "no tokens before the kill"
        time.sleep(0.05)


def _submit_when_ready(backend: RemoteBackend, request: Request) -> bool:
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            backend.submit(request)
            return True
        except EngineStoppedError:
            time.sleep(0.5)
    return False
