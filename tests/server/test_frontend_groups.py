"""The frontend's request groups over a real LocalBackend (tiny model, engine loop thread):
groups submitted at once are taken all or none, and a reader cancelled as a delta arrives
stops (on Python 3.11 asyncio.wait_for lost that cancel)."""

import asyncio
from pathlib import Path

import pytest

from daemon.runtime.engine.builder import EngineSpec, build_engine
from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.request import Request, RequestDelta
from daemon.runtime.engine.stop import FINISH_ABORT
from daemon.runtime.errors import EngineOverloadedError
from daemon.runtime.sampling.params import SamplingParams
from specctl.server.frontend import Frontend, RequestGroup
from specctl.server.local_backend import LocalBackend
from tests.tiny_models import make_tiny_checkpoint

BATCH, WAITING = 1, 3  # four requests in flight at most


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("groups") / "target", seed=0)


def _backend(target: Path) -> LocalBackend:
    spec = EngineSpec(
        target=target,
        max_model_len=128,
        engine=EngineConfig(max_batch_size=BATCH, num_speculative_tokens=0),
    )
    return LocalBackend(build_engine(spec), "tiny", max_waiting=WAITING)


def test_groups_submitted_at_once_are_taken_all_or_none(target: Path) -> None:
    """Three groups of two prompts against room for four: two are taken whole and run to the
    end, the third is refused before any of it is queued (each took places in turns until
    it met a full engine: all three were refused, and the places they took were aborted)."""
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)

    async def scenario() -> list[list[RequestDelta] | BaseException]:
        frontend = Frontend(_backend(target), [])
        await frontend.start()
        try:

            async def one(g: int) -> list[RequestDelta]:
                requests = [Request(f"g{g}-{i}", [3 + g, 7, 11 + i], params) for i in range(2)]
                group = await frontend.submit(requests)
                return [d async for _, d in group.deltas(frontend.idle_timeout_s)]

            outcomes = await asyncio.gather(*(one(g) for g in range(3)), return_exceptions=True)
            # what was refused holds no place: a group of four is taken now
            assert frontend.num_open_requests == 0
            assert len(await one_more(frontend, params)) >= 4
            return outcomes
        finally:
            await frontend.stop()

    outcomes = asyncio.run(scenario())
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    taken = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(refused) == 1 and isinstance(refused[0], EngineOverloadedError)
    assert "4 requests are in flight and this one brings 2 (at most 4 at once)" in str(refused[0])
    for deltas in taken:
        finished = [d for d in deltas if d.finished]
        assert len(finished) == 2
        assert all(d.finish_reason == "length" and d.num_output_tokens == 8 for d in finished)
        assert not any(d.finish_reason == FINISH_ABORT for d in deltas)


async def one_more(frontend: Frontend, params: SamplingParams) -> list[RequestDelta]:
    group = await frontend.submit([Request(f"late-{i}", [5, 6, i], params) for i in range(4)])
    return [d async for _, d in group.deltas(frontend.idle_timeout_s)]


def test_a_reader_cancelled_as_its_delta_arrives_stops() -> None:
    """The client went away just as a delta came: the reader must end cancelled, not read
    on to the abort (whose error then went unread, logged with a traceback)."""

    async def reader(group: RequestGroup) -> None:
        async for _ in group.deltas(30.0):
            pass

    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        lost = 0
        for i in range(60):
            group = RequestGroup(["r"])
            task = asyncio.ensure_future(reader(group))
            for _ in range(i % 3):
                await asyncio.sleep(0)
            delta = RequestDelta("r", [1], None, 1, 1)
            if i % 2:
                group.queue.put_nowait((0, delta))
                task.cancel()
            else:
                loop.call_soon(group.queue.put_nowait, (0, delta))
                loop.call_soon(task.cancel)
            for _ in range(5):
                await asyncio.sleep(0)
            if not task.done():
                lost += 1
                task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        return lost

    assert asyncio.run(scenario()) == 0
