"""Serving under open-loop load, in process: target-only, fixed k and adaptive side by side.

    python -m bench.open_loop [--shape demo|narrow|wide | --target DIR --draft DIR]
                              [--load 0.7 | --rate R] [--requests N] [--max-batch B]
                              [--seed S] [--seeds N] [--prefill-chunks none,64]
                              [--prompt-repeat R]

Requests arrive at random (a Poisson process), each with its own prompt (code and prose mixed)
and its own length, and leave when done: the batch grows and shrinks the way a server's does,
where `specctl bench` holds it at a fixed concurrency with a closed batch. Every configuration
gets the same arrivals. Each engine runs on its own clock, which advances by its steps' wall
time and jumps ahead over idle spells to the next arrival; the engines step in turn, the one
whose clock is earliest next, so they go through the same moments of the arrival process
together and a slow spell of a shared machine falls on all of them alike.

`--load` sets the arrival rate as a share of what target-only sustains with a full batch
(measured here first, on the same engine, with a closed batch of `--max-batch` requests of the
mean length); `--rate` sets it in requests per second instead. Reported per configuration:
latency from arrival to the last token (mean, p50, p90, p99), time to the first token (which the
engine hands out when the prefill is done, before the step's round), the gaps between a
request's successive deliveries of tokens (p50, p99, max: what a prefill, or anything else
holding a step up, makes a stream stall for), tokens per second of busy time, the share of the
time busy, the mean batch size and, for speculation, the mean tokens drafted per round. Greedy
outputs are checked identical across configurations. With `--seeds N` the whole comparison
runs on the arrivals of N seeds in turn, and a last table gives each configuration's ratios to
target-only per seed and their median.

`--prefill-chunks none,64` runs every configuration once per setting of the engine's
prefill_chunk_tokens (none: whole prompts at admission), side by side; `--prompt-repeat R` makes
each prompt R copies of itself, for prompts long enough that their prefill holds streams up.
"""

import argparse
import json
import math
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from rich.table import Table

from bench.arg_types import positive_int, prompt_file
from bench.machine import describe_machine
from bench.spec_engine import RunSpec, SpecBench
from bench.workload import load_prompt_texts, tokenize
from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.request import Request, RequestDelta
from daemon.runtime.engine.stats import EngineStats
from daemon.runtime.errors import SpecError
from daemon.runtime.sampling.params import SamplingParams
from specctl.console import make_console
from specctl.demo_pair import DEMO_PROMPTS_CODE, DEMO_PROMPTS_PROSE, demo_pair_dirs

SEED_BASE = 4321  # a sampled request's seed: this plus its index
SHAPES = ("demo", "narrow", "wide")


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float  # seconds after the start
    prompt: list[int]
    max_tokens: int


def make_arrivals(
    prompts: list[list[int]],
    num_requests: int,
    rate: float,
    min_tokens: int,
    max_tokens: int,
    seed: int,
) -> list[Arrival]:
    """`num_requests` arrivals of a Poisson process of `rate` per second, each with a prompt
    drawn from `prompts` and a length drawn uniformly from [min_tokens, max_tokens]."""
    if rate <= 0.0 or not math.isfinite(rate):
        raise ValueError(f"the arrival rate must be a positive number, got {rate}")
    if not 1 <= min_tokens <= max_tokens:
        raise ValueError(f"lengths must satisfy 1 <= min <= max, got {min_tokens}..{max_tokens}")
    rng = random.Random(seed)
    arrivals, now = [], 0.0
    for _ in range(num_requests):
        now += rng.expovariate(rate)
        arrivals.append(Arrival(now, rng.choice(prompts), rng.randint(min_tokens, max_tokens)))
    return arrivals


@dataclass(slots=True)
class LoadResult:
    mode: str
    num_requests: int
    num_tokens: int
    busy_s: float  # the engine's steps' wall time
    span_s: float  # its clock at the end: busy time plus idle spells
    tokens_per_busy_s: float
    latency_ms: dict[str, float]  # arrival to last token: mean, p50, p90, p99
    ttft_ms: dict[str, float]  # arrival to first token: mean, p50, p90
    gap_ms: dict[str, float]  # between a request's successive deliveries: mean, p50, p99, max
    mean_batch: float  # sequences per round, over rounds that ran any
    mean_k: float  # tokens drafted per sequence per round (0: target-only)
    acceptance_rate: float | None
    outputs: dict[str, list[int]] = field(repr=False)  # request id -> its tokens

    @property
    def busy_share(self) -> float:
        return self.busy_s / self.span_s if self.span_s > 0.0 else 0.0

    def summary(self) -> dict[str, object]:
        data = asdict(self)
        data.pop("outputs")
        data["busy_share"] = self.busy_share
        return data


@dataclass(slots=True)
class _Lane:
    """One engine going through the arrivals on its own clock."""

    mode: str
    engine: SpecEngine
    clock_s: float = 0.0
    busy_s: float = 0.0
    next_arrival: int = 0
    arrived: dict[str, float] = field(default_factory=dict)  # request id -> arrival time
    first_token: dict[str, float] = field(default_factory=dict)  # request id -> its time
    last_delivery: dict[str, float] = field(default_factory=dict)  # request id -> its time
    gaps: list[float] = field(default_factory=list)  # between a request's deliveries
    finished: dict[str, float] = field(default_factory=dict)
    outputs: dict[str, list[int]] = field(default_factory=dict)
    rounds: int = 0
    batch_sum: int = 0
    drafted_sum: int = 0  # speculation length x batch size over rounds

    def pending(self, arrivals: list[Arrival]) -> bool:
        return self.engine.has_unfinished() or self.next_arrival < len(arrivals)

    def deliver(self, delta: RequestDelta, at_s: float) -> None:
        """A delta handed out at `at_s` on the lane's clock (only those carrying tokens count)."""
        if not delta.new_token_ids:
            return
        rid = delta.request_id
        last = self.last_delivery.get(rid)
        if last is None:
            self.first_token[rid] = at_s
        else:
            self.gaps.append(at_s - last)
        self.last_delivery[rid] = at_s


def _percentiles(
    values: list[float], qs: tuple[float, ...], with_max: bool = False
) -> dict[str, float]:
    ordered = sorted(values)
    out = {"mean": 1000.0 * statistics.fmean(ordered)}
    for q in qs:
        index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
        out[f"p{round(100 * q)}"] = 1000.0 * ordered[index]
    if with_max:
        out["max"] = 1000.0 * ordered[-1]
    return out


def run_open_loop(
    bench: SpecBench,
    specs: list[RunSpec],
    arrivals: list[Arrival],
    max_batch: int,
    temperature: float = 0.0,
) -> list[LoadResult]:
    """Every configuration through the same arrivals, each on its own engine (warmed first
    with a closed batch), stepped in turn by earliest clock (the module doc says why)."""
    lanes = [
        _Lane(
            spec.mode,
            bench.engine(max_batch, spec.k, spec.adaptive, i * max_batch, spec.prefill_chunk),
        )
        for i, spec in enumerate(specs)
    ]
    warm = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    for lane in lanes:
        lane.engine.generate(
            Request(f"warmup{i}", a.prompt, warm) for i, a in enumerate(arrivals[:max_batch])
        )
        lane.engine.stats = EngineStats()  # the warm-up's rounds left out

    def admit(lane: _Lane) -> None:
        if not lane.engine.has_unfinished() and lane.next_arrival < len(arrivals):
            lane.clock_s = max(lane.clock_s, arrivals[lane.next_arrival].at_s)  # idle till then
        while (
            lane.next_arrival < len(arrivals) and arrivals[lane.next_arrival].at_s <= lane.clock_s
        ):
            i = lane.next_arrival
            arrival = arrivals[i]
            params = SamplingParams(
                temperature=temperature,
                max_tokens=arrival.max_tokens,
                ignore_eos=True,
                seed=None if temperature == 0.0 else SEED_BASE + i,
            )
            lane.engine.add_request(Request(f"r{i}", arrival.prompt, params))
            lane.arrived[f"r{i}"] = arrival.at_s
            lane.next_arrival += 1

    while live := [j for j, lane in enumerate(lanes) if lane.pending(arrivals)]:
        lane = lanes[min(live, key=lambda j: (lanes[j].clock_s, j))]
        admit(lane)
        start = time.perf_counter()

        def prefilled(firsts: list[RequestDelta], lane: _Lane = lane, start: float = start) -> None:
            at = lane.clock_s + (time.perf_counter() - start)  # streamed before the round
            for delta in firsts:
                lane.deliver(delta, at)

        step = lane.engine.step(prefilled)
        spent = time.perf_counter() - start
        lane.busy_s += spent
        lane.clock_s += spent
        stats = step.stats
        if stats.batch_size:
            lane.rounds += 1
            lane.batch_sum += stats.batch_size
            lane.drafted_sum += stats.speculation_len * stats.batch_size
        for delta in step.deltas:
            lane.deliver(delta, lane.clock_s)
        for out in step.finished:
            lane.finished[out.request_id] = lane.clock_s
            lane.outputs[out.request_id] = list(out.token_ids)
    return [_result(lane) for lane in lanes]


def _result(lane: _Lane) -> LoadResult:
    ids = list(lane.finished)
    latency = [lane.finished[i] - lane.arrived[i] for i in ids]
    ttft = [lane.first_token[i] - lane.arrived[i] for i in ids if i in lane.first_token]
    tokens = sum(len(t) for t in lane.outputs.values())
    stats = lane.engine.stats
    return LoadResult(
        mode=lane.mode,
        num_requests=len(ids),
        num_tokens=tokens,
        busy_s=lane.busy_s,
        span_s=lane.clock_s,
        tokens_per_busy_s=tokens / lane.busy_s if lane.busy_s > 0.0 else 0.0,
        latency_ms=_percentiles(latency, (0.5, 0.9, 0.99)) if latency else {},
        ttft_ms=_percentiles(ttft, (0.5, 0.9)) if ttft else {},
        gap_ms=_percentiles(lane.gaps, (0.5, 0.99), with_max=True) if lane.gaps else {},
        mean_batch=lane.batch_sum / lane.rounds if lane.rounds else 0.0,
        mean_k=lane.drafted_sum / lane.batch_sum if lane.batch_sum else 0.0,
        acceptance_rate=stats.acceptance_rate if stats.num_draft_tokens else None,
        outputs=lane.outputs,
    )


def full_batch_rate(
    bench: SpecBench, prompts: list[list[int]], max_batch: int, tokens: int
) -> float:
    """Tokens per second target-only sustains with a closed batch of `max_batch` requests of
    `tokens` each (its second run: the first warms it), on the first engine's slots."""
    engine = bench.engine(max_batch, 0, False, 0)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    batch = [prompts[i % len(prompts)] for i in range(max_batch)]
    rate = 0.0
    for run in range(2):
        start = time.perf_counter()
        outs = engine.generate(Request(f"c{run}-{i}", p, params) for i, p in enumerate(batch))
        rate = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)
    return rate


def identical_outputs(results: list[LoadResult]) -> bool:
    """Greedy decoding is lossless: every configuration gave every request the same tokens."""
    return all(r.outputs == results[0].outputs for r in results[1:])


def results_table(results: list[LoadResult], title: str) -> Table:
    table = Table(title=title)
    columns = (
        "mode",
        "latency mean ms",
        "p50",
        "p90",
        "p99",
        "TTFT p50 ms",
        "gap p99 ms",
        "gap max",
        "latency speedup",
        "tokens/busy s",
        "busy",
        "mean batch",
        "mean k",
        "acceptance",
    )
    for col in columns:
        table.add_column(col, justify="right")
    # target-only (with the first prefill chunk setting, where several run): the first result
    base = results[0] if results and results[0].mode.startswith("target-only") else None
    for r in results:
        lat = r.latency_ms
        speedup = (
            f"{base.latency_ms['mean'] / lat['mean']:.3f}" if base is not None and lat else "-"
        )
        table.add_row(
            r.mode,
            f"{lat.get('mean', 0.0):.1f}",
            f"{lat.get('p50', 0.0):.1f}",
            f"{lat.get('p90', 0.0):.1f}",
            f"{lat.get('p99', 0.0):.1f}",
            f"{r.ttft_ms.get('p50', 0.0):.1f}",
            f"{r.gap_ms.get('p99', 0.0):.1f}",
            f"{r.gap_ms.get('max', 0.0):.1f}",
            speedup,
            f"{r.tokens_per_busy_s:.1f}",
            f"{r.busy_share:.0%}",
            f"{r.mean_batch:.1f}",
            f"{r.mean_k:.2f}",
            "-" if r.acceptance_rate is None else f"{r.acceptance_rate:.3f}",
        )
    return table


@dataclass(slots=True)
class SeedSummary:
    """One configuration over several arrival seeds: per seed, its mean latency's speedup over
    target-only's and its tokens per busy second over target-only's; and their medians."""

    mode: str
    latency_speedups: list[float]
    throughput_ratios: list[float]

    @property
    def median_latency_speedup(self) -> float:
        return statistics.median(self.latency_speedups)

    @property
    def median_throughput_ratio(self) -> float:
        return statistics.median(self.throughput_ratios)


def summarize_seeds(per_seed: list[list[LoadResult]]) -> list[SeedSummary]:
    """Each configuration's ratios to target-only (the first result of every run), per seed."""
    summaries = [SeedSummary(r.mode, [], []) for r in per_seed[0]]
    for results in per_seed:
        base = results[0]
        for summary, r in zip(summaries, results, strict=True):
            summary.latency_speedups.append(base.latency_ms["mean"] / r.latency_ms["mean"])
            summary.throughput_ratios.append(r.tokens_per_busy_s / base.tokens_per_busy_s)
    return summaries


def seeds_table(summaries: list[SeedSummary], seeds: list[int]) -> Table:
    table = Table(title=f"over arrival seeds {', '.join(map(str, seeds))}: x target-only")
    for col in ("mode", "mean latency speedup, median", "per seed", "tokens/busy s, median"):
        table.add_column(col, justify="right")
    for summary in summaries:
        table.add_row(
            summary.mode,
            f"{summary.median_latency_speedup:.3f}",
            " ".join(f"{v:.3f}" for v in summary.latency_speedups),
            f"{summary.median_throughput_ratio:.3f}",
        )
    return table


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0.0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0.0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _k_list(text: str) -> list[int]:
    try:
        values = [int(n) for n in text.split(",")] if text else []
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}"
        ) from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"every k must be >= 1, got {text!r}")
    return values


def _chunk_list(text: str) -> list[int | None]:
    """'none,64' -> [None, 64]: prefill chunk settings, each none or a positive integer."""
    chunks: list[int | None] = []
    for part in text.split(","):
        part = part.strip().lower()
        if part == "none":
            chunks.append(None)
            continue
        try:
            value = int(part)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a prefill chunk: give 'none' or a positive integer"
            )
        chunks.append(value)
    if len(set(chunks)) != len(chunks):
        raise argparse.ArgumentTypeError(f"{text!r} names a setting twice")
    return chunks


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.open_loop",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="demo",
        help="demo: the demo pair; narrow, wide: the cost-scaled targets `specctl bench` "
        "builds (built here into .bench-out if missing). Ignored with --target.",
    )
    parser.add_argument("--target", type=Path, default=None)
    parser.add_argument("--draft", type=Path, default=None)
    parser.add_argument(
        "--prompts",
        type=prompt_file,
        action="append",
        default=None,
        help="A prompts file (repeatable; default: the demo code and prose prompts).",
    )
    parser.add_argument("--requests", type=positive_int, default=96)
    rate = parser.add_mutually_exclusive_group()
    rate.add_argument(
        "--load",
        type=_positive_float,
        default=0.7,
        help="Arrival rate as a share of target-only's full-batch throughput (default 0.7).",
    )
    rate.add_argument("--rate", type=_positive_float, default=None, help="Requests per second.")
    parser.add_argument("--max-batch", type=positive_int, default=16)
    parser.add_argument("--min-tokens", type=positive_int, default=16)
    parser.add_argument("--max-tokens", type=positive_int, default=160)
    parser.add_argument("--ks", type=_k_list, default=[2, 4], help="Fixed k run beside adaptive.")
    parser.add_argument(
        "--adaptive-max-k", type=positive_int, default=6, help="Adaptive's ceiling (default 6)."
    )
    parser.add_argument("--temperature", type=_non_negative_float, default=0.0)
    parser.add_argument("--seed", type=int, default=0, help="Seed of the arrivals.")
    parser.add_argument(
        "--seeds",
        type=positive_int,
        default=1,
        help="Run the arrivals of this many seeds (--seed on) and report each configuration's "
        "median ratios to target-only over them (one run's ratios move by ~5%% near saturation).",
    )
    parser.add_argument(
        "--prefill-chunks",
        type=_chunk_list,
        default=[None],
        help="Comma-separated prefill_chunk_tokens settings (none: whole prompts); every "
        "configuration runs once per setting, side by side (default: none).",
    )
    parser.add_argument(
        "--prompt-repeat",
        type=positive_int,
        default=1,
        help="Each prompt made this many copies of itself (longer prefills; default 1).",
    )
    parser.add_argument("--threads", type=positive_int, default=1, help="torch intra-op threads.")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", type=Path, default=None, help="Write the results here.")
    args = parser.parse_args(argv)
    if args.min_tokens > args.max_tokens:
        parser.error(f"--min-tokens {args.min_tokens} is above --max-tokens {args.max_tokens}")
    args.parser = parser
    return args


def _pair(args: argparse.Namespace) -> tuple[Path, Path]:
    target_dir, draft_dir = demo_pair_dirs()
    if args.draft is not None:
        draft_dir = args.draft
    if args.target is not None:
        return args.target, draft_dir
    if args.shape == "demo":
        return target_dir, draft_dir
    from specctl.commands.bench import resolve_targets

    out_dir = Path(".bench-out")
    out_dir.mkdir(exist_ok=True)
    targets = resolve_targets(args.shape, None, 30.0, out_dir, make_console())
    return targets[args.shape], draft_dir


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    target_dir, draft_dir = _pair(args)
    base_specs = [
        RunSpec("target-only"),
        *(RunSpec(f"spec k={k}", k) for k in args.ks),
        RunSpec(f"spec adaptive<={args.adaptive_max_k}", args.adaptive_max_k, adaptive=True),
    ]
    named = args.prefill_chunks != [None]
    specs = [
        RunSpec(
            f"{s.mode} chunk={'none' if chunk is None else chunk}" if named else s.mode,
            s.k,
            s.adaptive,
            chunk,
        )
        for chunk in args.prefill_chunks
        for s in base_specs
    ]
    try:
        bench = SpecBench(target_dir, draft_dir, args.dtype, args.max_batch, num_engines=len(specs))
    except SpecError as exc:
        args.parser.error(str(exc))
    files = args.prompts or [DEMO_PROMPTS_CODE, DEMO_PROMPTS_PROSE]
    prompts = tokenize(bench.tokenizer, [t for f in files for t in load_prompt_texts(f)])
    prompts = [p * args.prompt_repeat for p in prompts]
    mean_tokens = (args.min_tokens + args.max_tokens) / 2.0
    console = make_console()
    if args.rate is not None:
        rate = args.rate
        how = f"{rate:.2f} requests/s"
    else:
        capacity = full_batch_rate(bench, prompts, args.max_batch, round(mean_tokens))
        rate = args.load * capacity / mean_tokens
        how = (
            f"{rate:.2f} requests/s = {args.load:g} x target-only's full-batch "
            f"{capacity:.0f} tokens/s / {mean_tokens:g} tokens a request"
        )
    console.print(
        f"{args.requests} requests arriving at {how}, {args.min_tokens}-{args.max_tokens} "
        f"tokens each, at most {args.max_batch} at once; {torch.get_num_threads()} thread(s)"
    )
    seeds = list(range(args.seed, args.seed + args.seeds))
    per_seed: list[list[LoadResult]] = []
    for seed in seeds:
        arrivals = make_arrivals(
            prompts, args.requests, rate, args.min_tokens, args.max_tokens, seed
        )
        results = run_open_loop(bench, specs, arrivals, args.max_batch, args.temperature)
        per_seed.append(results)
        title = f"open-loop load: {target_dir.name} + {draft_dir.name}, arrival seed {seed}"
        console.print(results_table(results, title))
        if args.temperature == 0.0:
            console.print(f"greedy outputs identical across modes: {identical_outputs(results)}")
    summaries = summarize_seeds(per_seed)
    if len(seeds) > 1:
        console.print(seeds_table(summaries, seeds))
    if args.json:
        report = {
            "machine": describe_machine(args.threads),
            "target": str(target_dir),
            "draft": str(draft_dir),
            "rate_per_s": rate,
            "arrivals": args.requests,
            "max_batch": args.max_batch,
            "seeds": seeds,
            "results": [r.summary() for r in per_seed[0]],  # the first seed's, as before
            "per_seed": [[r.summary() for r in results] for results in per_seed],
            "over_seeds": [
                {
                    "mode": s.mode,
                    "latency_speedups": s.latency_speedups,
                    "throughput_ratios": s.throughput_ratios,
                    "median_latency_speedup": s.median_latency_speedup,
                    "median_throughput_ratio": s.median_throughput_ratio,
                }
                for s in summaries
            ],
        }
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    from specctl.quiet_exit import run_and_exit

    run_and_exit(main)
