"""Run a blocking call (loading models) in a daemon thread and await it.

Not the event loop's default executor: `asyncio.run` joins that executor's threads at exit, so a
server stopped (SIGTERM) while a large model is still loading would wait for the load to end.
A daemon thread is left behind instead, and the process exits at once.
"""

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def run_in_daemon_thread(fn: Callable[[], T], name: str) -> T:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():  # cancelled: nobody waits any more
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result, error = fn(), None
        except BaseException as exc:  # handed to the awaiting coroutine
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed while we worked (shutdown)
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await future
