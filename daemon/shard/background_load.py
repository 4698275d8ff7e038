"""Load a shard's models on a thread of its own, so that the actor answers status calls
(state, progress, error) while the weights are still being read."""

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from daemon.runtime.errors import SpecError
from daemon.shard.node_context import NodeContext
from daemon.shard.specs import ShardRole, ShardState, ShardStatus

logger = logging.getLogger(__name__)

T = TypeVar("T")
Progress = Callable[[int, int], None]  # (bytes loaded, bytes in all)


class NotReadyError(SpecError):
    """The shard is still loading, failed to load, or was stopped."""


class BackgroundLoad(Generic[T]):
    def __init__(self, build: Callable[[Progress], T], name: str) -> None:
        self._build = build
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.state: ShardState = "loading"
        self.error: str | None = None
        self.loaded_bytes = 0
        self.total_bytes = 0
        self.load_time_s = 0.0
        self._value: T | None = None
        self._thread = threading.Thread(target=self._run, name=f"load-{name}", daemon=True)
        self._thread.start()

    def report(
        self, role: ShardRole, context: NodeContext, failure: str | None = None
    ) -> ShardStatus:
        """The shard's status: this load's state and progress, where the shard runs; a
        `failure` found since (a broken parallel group) reports it as failed."""
        return ShardStatus(
            role=role,
            state="failed" if failure else self.state,
            node_id=context.node_id,
            node_name=context.node_name,
            pid=context.pid,
            instance_id=context.instance_id,
            error=failure or self.error,
            loaded_bytes=self.loaded_bytes,
            total_bytes=self.total_bytes,
            load_time_s=self.load_time_s,
        )

    def _progress(self, loaded_bytes: int, total_bytes: int) -> None:
        with self._lock:
            self.loaded_bytes, self.total_bytes = loaded_bytes, total_bytes

    def _run(self) -> None:
        start = time.perf_counter()
        try:
            value = self._build(self._progress)
        except SpecError as exc:
            self._finish(None, str(exc), start)
        except Exception as exc:  # a shard must report why it failed, not die silently
            logger.exception("shard failed to load")
            self._finish(None, f"{type(exc).__name__}: {exc}", start)
        else:
            self._finish(value, None, start)

    def _finish(self, value: T | None, error: str | None, start: float) -> None:
        with self._lock:
            self._value, self.error = value, error
            self.state = "ready" if error is None else "failed"
            self.load_time_s = time.perf_counter() - start
        self._done.set()

    def wait(self, timeout_s: float) -> bool:
        """Whether loading has ended (ready or failed) within `timeout_s`."""
        return self._done.wait(timeout_s)

    def get(self) -> T:
        """The loaded value; NotReadyError while loading or after a failure."""
        with self._lock:
            if self.state == "ready" and self._value is not None:
                return self._value
            if self.state == "failed":
                raise NotReadyError(f"the shard failed to load: {self.error}")
            raise NotReadyError(f"the shard is {self.state}")

    def stop(self) -> None:
        with self._lock:
            self.state = "stopped"
            self._value = None
