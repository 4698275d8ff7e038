"""`specctl demo`: the main job, on the product's real path.

Apply `examples/local.toml` (two Ray nodes on this machine, the demo verifier on one, its
drafter on the other, the serving process in front), send held-out code prompts through the
endpoint with the official `openai` client, and print the acceptance rate, mean acceptance
length and tokens/s the endpoint itself measured (its Prometheus `/metrics`, before and after).
The deployment stays up; the last lines say how to reach it and how to stop it.
"""

import contextlib
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from specctl.apply.status import read_status
from specctl.console import make_console
from specctl.demo_pair import DEMO_PROMPTS_CODE, REPO_ROOT, require_demo_pair
from specctl.home import SpecctlHome

DEFAULT_CONFIG = REPO_ROOT / "examples" / "local.toml"
REQUEST_TIMEOUT_S = 120.0
SHOWN_COMPLETIONS = 2
COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:generation_tokens",
    "vllm:prompt_tokens",
)


class DemoError(Exception):
    """The demo could not run; the message says what failed and what to do."""


@dataclass(slots=True)
class DemoFigures:
    endpoint: str
    num_requests: int
    num_generated_tokens: int
    wall_s: float
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.num_generated_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None


def run_demo(
    config: Path, num_prompts: int, max_tokens: int, concurrency: int, as_json: bool
) -> DemoFigures:
    require_demo_pair()
    if as_json:  # stdout holds the figures alone; everything else goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            figures = _demo(config, num_prompts, max_tokens, concurrency, as_json)
        print(json.dumps(_figures_json(figures)))
        return figures
    return _demo(config, num_prompts, max_tokens, concurrency, as_json)


def _demo(
    config: Path, num_prompts: int, max_tokens: int, concurrency: int, as_json: bool
) -> DemoFigures:
    from specctl.commands.deployment import run_apply

    console = make_console()
    console.print(f"[bold]specctl demo[/]: applying {config}")
    if run_apply(config, as_json=False, load_timeout_s=900.0) != 0:
        raise DemoError("apply failed (above); `specctl down` stops whatever it started")
    status = read_status(SpecctlHome.resolve())
    if status.endpoint is None or status.served_model_name is None:
        raise DemoError("the deployment has no endpoint; see `specctl status`")
    _print_placement(console, status.shards)
    prompts = _prompts(num_prompts)
    figures, outputs = _run_requests(
        status.endpoint, status.served_model_name, prompts, max_tokens, concurrency
    )
    if not as_json:
        for prompt, text in list(zip(prompts, outputs, strict=True))[:SHOWN_COMPLETIONS]:
            console.rule("prompt (end)")
            console.print(prompt[-300:], markup=False, highlight=False)
            console.rule("completion through the endpoint")
            console.print(text, markup=False, highlight=False)
        console.print(_table(figures, concurrency))
    _print_how_to(console, status.endpoint, status.served_model_name)
    return figures


def _prompts(num_prompts: int) -> list[str]:
    lines = [line for line in DEMO_PROMPTS_CODE.read_text().splitlines() if line.strip()]
    return [json.loads(line)["prompt"] for line in lines[:num_prompts]]


def _run_requests(
    endpoint: str, model: str, prompts: list[str], max_tokens: int, concurrency: int
) -> tuple[DemoFigures, list[str]]:
    import openai

    client = openai.OpenAI(base_url=endpoint, api_key="demo", timeout=REQUEST_TIMEOUT_S)
    metrics_url = endpoint.removesuffix("/v1") + "/metrics"
    before = _counters(metrics_url)
    start = time.perf_counter()

    def complete(prompt: str) -> str:
        out = client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, temperature=0
        )
        return out.choices[0].text

    try:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            outputs = list(pool.map(complete, prompts))
    except openai.OpenAIError as exc:
        raise DemoError(f"a request to {endpoint} failed: {exc}") from None
    wall_s = time.perf_counter() - start
    after = _counters(metrics_url)
    delta = {name: after[name] - before[name] for name in COUNTERS}
    figures = DemoFigures(
        endpoint=endpoint,
        num_requests=len(prompts),
        num_generated_tokens=int(delta["vllm:generation_tokens"]),
        wall_s=wall_s,
        num_drafts=int(delta["vllm:spec_decode_num_drafts"]),
        num_draft_tokens=int(delta["vllm:spec_decode_num_draft_tokens"]),
        num_accepted_tokens=int(delta["vllm:spec_decode_num_accepted_tokens"]),
    )
    return figures, outputs


def _counters(url: str) -> dict[str, float]:
    """The endpoint's own counters, summed over their labels."""
    try:
        text = httpx.get(url, timeout=10.0).text
    except httpx.HTTPError as exc:
        raise DemoError(f"{url} did not answer: {exc}") from None
    totals = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in totals:
                totals[name] += sample.value
    return totals


def _print_placement(console: Console, shards: list) -> None:  # type: ignore[type-arg]
    for shard in shards:
        console.print(
            f"  {shard.role:<8} {shard.id} on [bold]{shard.running_on or shard.node}[/] "
            f"({shard.state}, pid {shard.pid or '-'})"
        )


def _table(figures: DemoFigures, concurrency: int) -> Table:
    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    table = Table(
        title=f"{figures.num_requests} held-out code prompts, greedy, {concurrency} at a time "
        "(figures from the endpoint's /metrics)"
    )
    for column in ("tokens", "wall s", "tokens/s", "acceptance rate", "mean acc. length"):
        table.add_column(column, justify="right")
    table.add_row(
        str(figures.num_generated_tokens),
        f"{figures.wall_s:.2f}",
        f"{figures.tokens_per_s:.1f}",
        num(figures.acceptance_rate, ".3f"),
        num(figures.mean_acceptance_length, ".2f"),
    )
    return table


def _figures_json(figures: DemoFigures) -> dict[str, object]:
    return {
        "endpoint": figures.endpoint,
        "num_requests": figures.num_requests,
        "num_generated_tokens": figures.num_generated_tokens,
        "wall_s": figures.wall_s,
        "tokens_per_s": figures.tokens_per_s,
        "acceptance_rate": figures.acceptance_rate,
        "mean_acceptance_length": figures.mean_acceptance_length,
    }


def _print_how_to(console: Console, endpoint: str, model: str) -> None:
    console.print(f"\nThe deployment stays up at [bold]{endpoint}[/] (model {model!r}):")
    console.print(
        f"  curl -s {endpoint}/completions -H 'content-type: application/json' \\\n"
        f'      -d \'{{"model": "{model}", "prompt": "def fib(n):", "max_tokens": 32}}\'',
        markup=False,
        highlight=False,
    )
    console.print("  specctl status    live acceptance rate and tokens/s, shards and nodes")
    console.print("  specctl down      stop everything (no process left behind)")
