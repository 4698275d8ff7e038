"""Streaming clients against an OpenAI-compatible /v1/completions, with per-stream timings.

Each client sends one streamed request at a time, back to back, until the deadline. What is
measured is what a client sees: time to first token (request sent -> first chunk with text),
inter-token latency as the gap between chunks (vLLM's benchmark definition: with speculative
decoding a chunk may carry several tokens), time per output token after the first, whether
the stream ended with `data: [DONE]`, and errors.
"""

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

REQUEST_TIMEOUT_S = 300.0


@dataclass(slots=True)
class StreamRecord:
    start_s: float
    end_s: float = 0.0
    first_s: float | None = None
    chunk_s: list[float] = field(default_factory=list)  # arrival of each chunk with text
    num_tokens: int = 0  # from the usage chunk
    is_done: bool = False  # ended with data: [DONE]
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_s is None else self.first_s - self.start_s

    @property
    def tpot_s(self) -> float | None:
        if self.first_s is None or self.num_tokens < 2:
            return None
        return (self.end_s - self.first_s) / (self.num_tokens - 1)


@dataclass(slots=True)
class LoadSummary:
    name: str
    num_requests: int
    num_errors: int
    num_done: int  # streams that ended with [DONE]
    num_tokens: int
    wall_s: float
    tokens_per_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    tpot_p50_ms: float | None
    first_error: str | None


def _pct_ms(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0] * 1000
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000


def summarise(name: str, records: list[StreamRecord], start_s: float) -> LoadSummary:
    ok = [r for r in records if r.error is None]
    wall_s = max((r.end_s for r in records), default=start_s) - start_s
    num_tokens = sum(r.num_tokens for r in ok)
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [b - a for r in ok for a, b in zip(r.chunk_s, r.chunk_s[1:], strict=False)]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    errors = [r.error for r in records if r.error is not None]
    return LoadSummary(
        name=name,
        num_requests=len(records),
        num_errors=len(errors),
        num_done=sum(r.is_done for r in records),
        num_tokens=num_tokens,
        wall_s=wall_s,
        tokens_per_s=num_tokens / wall_s if wall_s > 0 else 0.0,
        ttft_p50_ms=_pct_ms(ttft, 50),  # type: ignore[arg-type]
        ttft_p99_ms=_pct_ms(ttft, 99),  # type: ignore[arg-type]
        itl_p50_ms=_pct_ms(itl, 50),
        itl_p99_ms=_pct_ms(itl, 99),
        tpot_p50_ms=_pct_ms(tpot, 50),  # type: ignore[arg-type]
        first_error=errors[0] if errors else None,
    )


async def one_stream(client: httpx.AsyncClient, body: dict[str, Any]) -> StreamRecord:
    record = StreamRecord(start_s=time.perf_counter())
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {text[:200]}"
            else:
                await _read_events(response, record)
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    record.end_s = time.perf_counter()
    if record.error is None and not record.is_done:
        record.error = "the stream ended without data: [DONE]"
    return record


async def _read_events(response: httpx.Response, record: StreamRecord) -> None:
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            record.is_done = True
            return
        event = json.loads(data)
        if "error" in event:
            record.error = str(event["error"].get("message"))
        if event.get("usage"):
            record.num_tokens = int(event["usage"]["completion_tokens"])
        if event.get("choices") and event["choices"][0].get("text"):
            now = time.perf_counter()
            record.first_s = record.first_s or now
            record.chunk_s.append(now)


def request_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """Greedy, exactly max_tokens tokens (ignore_eos), streamed with a usage chunk."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _client(base_url: str, num_clients: int, api_key: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=num_clients + 4, max_keepalive_connections=num_clients)
    return httpx.AsyncClient(
        base_url=base_url, headers=headers, limits=limits, timeout=REQUEST_TIMEOUT_S
    )


async def run_load(
    base_url: str,
    model: str,
    prompts: list[str],
    num_clients: int,
    duration_s: float,
    max_tokens: int,
    api_key: str | None = None,
) -> tuple[list[StreamRecord], float]:
    """`num_clients` clients sending back to back until `duration_s` has passed (a request
    started before the deadline runs to its end). The records and the start time."""
    records: list[StreamRecord] = []
    start = time.perf_counter()
    deadline = start + duration_s

    async def client_loop(client: httpx.AsyncClient, index: int) -> None:
        sent = 0
        while time.perf_counter() < deadline:
            prompt = prompts[(index + sent * num_clients) % len(prompts)]
            records.append(await one_stream(client, request_body(model, prompt, max_tokens)))
            sent += 1

    async with _client(base_url, num_clients, api_key) as client:
        await asyncio.gather(*(client_loop(client, i) for i in range(num_clients)))
    return records, start


async def run_batch(
    base_url: str, model: str, prompts: list[str], max_tokens: int, api_key: str | None = None
) -> tuple[float, int]:
    """Every prompt at once, streamed: (wall seconds to the last [DONE], tokens generated)."""
    async with _client(base_url, len(prompts), api_key) as client:
        start = time.perf_counter()
        records = await asyncio.gather(
            *(one_stream(client, request_body(model, p, max_tokens)) for p in prompts)
        )
        wall_s = time.perf_counter() - start
    errors = [r.error for r in records if r.error]
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[0]}")
    return wall_s, sum(r.num_tokens for r in records)
