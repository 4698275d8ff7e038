"""A once-a-second summary of what the serving process did, for whoever listens.

`SnapshotRecorder` is a `ServingObserver`: it accumulates rounds and request latencies, and
`tick()` (called every interval by the app) turns the interval into a `MetricsSnapshot`,
keeps it as `latest`, and hands it to each listener. Listeners are plain callables: the serve
command logs a throughput line from them; the control plane will attach its SQLite writer.
"""

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from daemon.runtime.engine.loop import LoopOutput
from daemon.runtime.engine.request import RequestDelta
from daemon.runtime.engine.stats import RoundStats
from specctl.server.frontend import RequestTiming

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 1.0


@dataclass(slots=True)
class MetricsSnapshot:
    """One interval. Rates are None when the interval had nothing to measure them on."""

    time_s: float  # wall clock at the end of the interval
    interval_s: float
    num_requests_running: int
    num_requests_waiting: int
    num_rounds: int
    num_generated_tokens: int
    num_finished_requests: int
    tokens_per_s: float
    mean_batch_size: float
    max_batch_size: int
    speculation_len: int  # largest k asked for in the interval
    mean_speculation_len: float | None  # mean k over the interval's rounds; None: no rounds
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_rate: float | None
    acceptance_rate_per_pos: list[float]  # [K] accepted at position i / drafts
    mean_acceptance_length: float | None  # 1 + accepted / drafts (vLLM's definition)
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks; None for no values."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[max(0, min(98, round(q) - 1))]


@dataclass(slots=True)
class _Window:
    rounds: list[RoundStats] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)  # per token
    num_tokens: int = 0
    num_finished: int = 0


SnapshotListener = Callable[[MetricsSnapshot], None]


class SnapshotRecorder:
    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.latest: MetricsSnapshot | None = None
        self._listeners: list[SnapshotListener] = []
        self._window = _Window()
        self._num_running = 0
        self._num_waiting = 0
        self._window_start_s = time.monotonic()

    def add_listener(self, listener: SnapshotListener) -> None:
        self._listeners.append(listener)

    # -- ServingObserver --------------------------------------------------------------------
    def on_loop_output(self, output: LoopOutput) -> None:
        self._num_running, self._num_waiting = output.num_running, output.num_waiting
        self._window.rounds.extend(r for r in output.rounds if r.batch_size)

    def on_first_token(self, timing: RequestTiming, delta: RequestDelta) -> None:
        if timing.ttft_s is not None:
            self._window.ttft_s.append(timing.ttft_s)
        self._window.num_tokens += len(delta.new_token_ids)

    def on_tokens(self, num_tokens: int, gap_s: float) -> None:
        self._window.itl_s.extend([gap_s / num_tokens] * num_tokens)
        self._window.num_tokens += num_tokens

    def on_finished(self, timing: RequestTiming, delta: RequestDelta) -> None:
        self._window.num_finished += 1

    # -- the interval -----------------------------------------------------------------------
    def tick(self) -> MetricsSnapshot:
        """Close the interval: build its snapshot, hand it to every listener, start the next."""
        now = time.monotonic()
        window, self._window = self._window, _Window()
        interval_s = max(now - self._window_start_s, 1e-9)
        self._window_start_s = now
        snapshot = self._summarise(window, interval_s)
        self.latest = snapshot
        for listener in self._listeners:
            try:
                listener(snapshot)
            except Exception:
                logger.exception("metrics snapshot listener failed")
        return snapshot

    def _summarise(self, w: _Window, interval_s: float) -> MetricsSnapshot:
        sizes = [r.batch_size for r in w.rounds]
        num_drafts = sum(r.num_drafts for r in w.rounds)
        num_draft_tokens = sum(r.num_draft_tokens for r in w.rounds)
        num_accepted = sum(r.num_accepted_tokens for r in w.rounds)
        per_pos = [0] * max((len(r.accepted_per_pos) for r in w.rounds), default=0)
        for r in w.rounds:
            for pos, count in enumerate(r.accepted_per_pos):
                per_pos[pos] += count
        return MetricsSnapshot(
            time_s=time.time(),
            interval_s=interval_s,
            num_requests_running=self._num_running,
            num_requests_waiting=self._num_waiting,
            num_rounds=len(w.rounds),
            num_generated_tokens=w.num_tokens,
            num_finished_requests=w.num_finished,
            tokens_per_s=w.num_tokens / interval_s,
            mean_batch_size=statistics.fmean(sizes) if sizes else 0.0,
            max_batch_size=max(sizes, default=0),
            speculation_len=max((r.speculation_len for r in w.rounds), default=0),
            mean_speculation_len=(
                statistics.fmean(r.speculation_len for r in w.rounds) if w.rounds else None
            ),
            num_drafts=num_drafts,
            num_draft_tokens=num_draft_tokens,
            num_accepted_tokens=num_accepted,
            acceptance_rate=num_accepted / num_draft_tokens if num_draft_tokens else None,
            acceptance_rate_per_pos=[c / num_drafts for c in per_pos] if num_drafts else [],
            mean_acceptance_length=1 + num_accepted / num_drafts if num_drafts else None,
            ttft_p50_s=percentile(w.ttft_s, 50),
            ttft_p99_s=percentile(w.ttft_s, 99),
            itl_p50_s=percentile(w.itl_s, 50),
            itl_p99_s=percentile(w.itl_s, 99),
        )
