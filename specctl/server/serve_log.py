"""What `specctl serve` logs: one line per finished request, and a throughput line every few
seconds while there is traffic (from the per-second snapshots)."""

import logging
from dataclasses import dataclass

from daemon.runtime.engine.loop import LoopOutput
from daemon.runtime.engine.request import RequestDelta
from specctl.server.frontend import RequestTiming
from specctl.server.snapshot import MetricsSnapshot

logger = logging.getLogger("specctl.serve")

DEFAULT_STATS_INTERVAL_S = 10.0


def request_line(timing: RequestTiming, delta: RequestDelta) -> str:
    acceptance = (
        f"acceptance {delta.num_accepted_tokens / delta.num_draft_tokens:.2f} "
        f"({delta.num_accepted_tokens}/{delta.num_draft_tokens})"
        if delta.num_draft_tokens
        else "acceptance - (no drafts)"
    )
    ttft = f"{timing.ttft_s:.3f} s" if timing.ttft_s is not None else "-"
    line = (
        f"request {delta.request_id}: prompt {delta.num_prompt_tokens} tokens, "
        f"output {delta.num_output_tokens} tokens ({delta.finish_reason}), {acceptance}, "
        f"ttft {ttft}, total {timing.e2e_s:.3f} s"
    )
    return f"{line}: {delta.error}" if delta.error else line


class RequestLogger:
    """A `ServingObserver` that logs every finished request."""

    def on_loop_output(self, output: LoopOutput) -> None:
        pass

    def on_first_token(self, timing: RequestTiming, delta: RequestDelta) -> None:
        pass

    def on_tokens(self, num_tokens: int, gap_s: float) -> None:
        pass

    def on_finished(self, timing: RequestTiming, delta: RequestDelta) -> None:
        level = logging.WARNING if delta.finish_reason == "error" else logging.INFO
        logger.log(level, "%s", request_line(timing, delta))


@dataclass(slots=True)
class _Totals:
    interval_s: float = 0.0
    num_tokens: int = 0
    num_rounds: int = 0
    batch_sum: float = 0.0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    num_drafts: int = 0
    speculation_len: int = 0


class StatsLogger:
    """A snapshot listener: every `interval_s` with traffic, one line of engine figures."""

    def __init__(self, interval_s: float = DEFAULT_STATS_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._totals = _Totals()

    def __call__(self, snap: MetricsSnapshot) -> None:
        t = self._totals
        t.interval_s += snap.interval_s
        t.num_tokens += snap.num_generated_tokens
        t.num_rounds += snap.num_rounds
        t.batch_sum += snap.mean_batch_size * snap.num_rounds
        t.num_draft_tokens += snap.num_draft_tokens
        t.num_accepted += snap.num_accepted_tokens
        t.num_drafts += snap.num_drafts
        t.speculation_len = max(t.speculation_len, snap.speculation_len)
        if t.interval_s < self.interval_s:
            return
        self._totals = _Totals()
        if t.num_rounds:
            logger.info("%s", self._line(t, snap))

    @staticmethod
    def _line(t: _Totals, snap: MetricsSnapshot) -> str:
        line = (
            f"engine: {t.num_tokens / t.interval_s:.1f} tokens/s, "
            f"running {snap.num_requests_running}, waiting {snap.num_requests_waiting}, "
            f"mean batch {t.batch_sum / t.num_rounds:.1f}, k up to {t.speculation_len}"
        )
        if t.num_draft_tokens:
            line += (
                f", acceptance {t.num_accepted / t.num_draft_tokens:.2f}, "
                f"mean acceptance length {1 + t.num_accepted / max(t.num_drafts, 1):.2f}"
            )
        return line
