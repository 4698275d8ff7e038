"""Prometheus metrics of the serving process, under the names vLLM uses.

Existing vLLM dashboards read these unchanged: counters are exposed with `_total` (as vLLM's
are), every series has a `model_name` label, and the speculative-decoding counters are vLLM's
(`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`,
`..._num_accepted_tokens_per_pos{position}`). Latencies are measured in the serving process:
time to first token from arrival, inter-token latency as the gap between a request's deltas
spread over the tokens they carry (a round emits up to k + 1 tokens at once), end to end.

`specctl:*` series show what vLLM has no name for: the batch size of every verify round (the
proof of continuous batching), k in use, and where the engine's time goes.

Each app instance owns its registry (no process-global default registry), so two servers in
one process, or a test next to a server, never share series.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from daemon.runtime.engine.loop import LoopOutput
from daemon.runtime.engine.request import RequestDelta
from specctl.server.frontend import RequestTiming

CONTENT_TYPE = CONTENT_TYPE_LATEST
# vLLM's buckets, with finer steps below 10 ms for per-token latencies of small models
TTFT_BUCKETS_S = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
ITL_BUCKETS_S = (
    *(0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4),
    *(0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
E2E_BUCKETS_S = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
    *(120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
BATCH_SIZE_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256)


class ServerMetrics:
    """A `ServingObserver` that keeps the Prometheus series of one served model."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg, name = self.registry, model_name
        label = ["model_name"]

        # the series of this model (labelled once: `.labels()` takes a lock on every call)
        def counter(metric: str, doc: str) -> Counter:
            return Counter(metric, doc, label, registry=reg).labels(name)

        def histogram(metric: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(metric, doc, label, buckets=buckets, registry=reg).labels(name)

        def gauge(metric: str, doc: str) -> Gauge:
            return Gauge(metric, doc, label, registry=reg).labels(name)

        self.num_drafts = counter("vllm:spec_decode_num_drafts", "Sequences drafted for.")
        self.num_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens.")
        self.num_accepted = counter("vllm:spec_decode_num_accepted_tokens", "Accepted drafts.")
        self._accepted_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens at each position.",
            [*label, "position"],
            registry=reg,
        )
        self._request_success = Counter(
            "vllm:request_success", "Finished requests.", [*label, "finished_reason"], registry=reg
        )
        self._name = name
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefilled prompt tokens.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens.")
        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests queued for a slot.")
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Arrival to first token.", TTFT_BUCKETS_S
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Time per output token after the first.",
            ITL_BUCKETS_S,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Arrival to last token.", E2E_BUCKETS_S
        )
        self.batch_size = histogram(
            "specctl:batch_size", "Sequences in each verify round.", BATCH_SIZE_BUCKETS
        )
        self.speculation_len = gauge("specctl:num_speculative_tokens", "k of the last round.")
        self.num_steps = counter("specctl:engine_steps", "Engine steps that did work.")
        self.time_s = {
            part: counter(f"specctl:{part}_time_seconds", f"Engine time in {part}.")
            for part in ("prefill", "draft", "verify", "step")
        }

    # -- ServingObserver --------------------------------------------------------------------
    def on_loop_output(self, output: LoopOutput) -> None:
        self.running.set(output.num_running)
        self.waiting.set(output.num_waiting)
        for r in output.rounds:
            self.num_steps.inc()
            self.time_s["prefill"].inc(r.prefill_time_s)
            self.time_s["draft"].inc(r.draft_time_s)
            self.time_s["verify"].inc(r.verify_time_s)
            self.time_s["step"].inc(r.step_time_s)
            self.prompt_tokens.inc(r.num_prefill_tokens)
            if not r.batch_size:
                continue
            self.batch_size.observe(r.batch_size)
            self.speculation_len.set(r.speculation_len)
            self.num_drafts.inc(r.num_drafts)
            self.num_draft_tokens.inc(r.num_draft_tokens)
            self.num_accepted.inc(r.num_accepted_tokens)
            for pos, count in enumerate(r.accepted_per_pos):
                self._accepted_per_pos.labels(self._name, str(pos)).inc(count)

    def on_first_token(self, timing: RequestTiming, delta: RequestDelta) -> None:
        if timing.ttft_s is not None:
            self.ttft.observe(timing.ttft_s)
        self.generation_tokens.inc(len(delta.new_token_ids))

    def on_tokens(self, num_tokens: int, gap_s: float) -> None:
        per_token_s = gap_s / num_tokens
        for _ in range(num_tokens):
            self.itl.observe(per_token_s)
        self.generation_tokens.inc(num_tokens)

    def on_finished(self, timing: RequestTiming, delta: RequestDelta) -> None:
        reason = delta.finish_reason or "unknown"
        self._request_success.labels(self._name, reason).inc()
        if delta.finish_reason not in ("abort", "error"):
            self.e2e.observe(timing.e2e_s)

    # -- exposition -------------------------------------------------------------------------
    def exposition(self) -> bytes:
        return generate_latest(self.registry)
