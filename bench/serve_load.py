"""Load benchmark of the OpenAI endpoint: N concurrent streaming clients for T seconds.

    python -m bench.serve_load                       # starts specctl serve on the demo pair
    python -m bench.serve_load --url http://127.0.0.1:8000 --model NAME
    python -m bench.serve_load --clients 8 --duration-s 20 --no-vllm

Reports tokens/s, p50/p99 time to first token and inter-token latency, errors and streams that
ended in [DONE]; then the same load against `vllm serve` on the same pair when
bench/.venv-vllm exists (bench/setup_vllm_venv.sh), side by side. When it starts specctl
itself, it also measures the serving overhead per token: the same prompts through the
endpoint (all at once, streamed) against `specctl generate` with the same engine settings.
Figures taken while other work shares the CPU are noisy: say so when you quote them.
"""

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.load_client import LoadSummary, run_batch, run_load, summarise
from bench.serving import ServerSpec, start_specctl, start_vllm, vllm_missing
from bench.workload import load_prompt_texts
from specctl.demo_pair import DEMO_PROMPTS_CODE, demo_pair_dirs

NUM_OVERHEAD_REPEATS = 3
WARMUP_S = 5.0  # load before the timed run: the first passes at each batch size are slow


@dataclass(slots=True)
class Overhead:
    num_prompts: int
    num_tokens: int
    endpoint_s: float  # median wall time, all prompts at once through the endpoint
    generate_s: float  # median wall time of specctl generate's engine run
    per_token_ms: float  # (endpoint - generate) / tokens


def parse_args(argv: list[str]) -> argparse.Namespace:
    target, draft = demo_pair_dirs()
    p = argparse.ArgumentParser(prog="python -m bench.serve_load", description=__doc__)
    p.add_argument("--url", help="Load this server instead of starting specctl serve.")
    p.add_argument("--model", default="demo", help="Model name to request.")
    p.add_argument("--api-key", help="Bearer key for --url.")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--target", type=Path, default=target)
    p.add_argument("--draft", type=Path, default=draft)
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=4)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument(
        "--threads", type=int, default=1, help="CPU threads per engine (1: no oversubscription)."
    )
    p.add_argument("--no-vllm", action="store_true", help="Skip vLLM even if its venv exists.")
    p.add_argument("--out", type=Path, default=Path(".bench-out/serve_load.json"))
    args = p.parse_args(argv)
    if args.clients < 1 or args.duration_s <= 0 or args.max_tokens < 1:
        p.error("--clients, --duration-s and --max-tokens must be positive")
    return args


def load(name: str, url: str, args: argparse.Namespace, prompts: list[str]) -> LoadSummary:
    """A warm-up, then the timed load."""
    print(f"{name}: {args.clients} streaming clients for {args.duration_s:g} s ...", flush=True)
    common = (url, args.model, prompts, args.clients)
    asyncio.run(run_load(*common, WARMUP_S, args.max_tokens, args.api_key))
    records, start = asyncio.run(run_load(*common, args.duration_s, args.max_tokens, args.api_key))
    return summarise(name, records, start)


def measure_overhead(url: str, args: argparse.Namespace, prompts: list[str]) -> Overhead:
    """The same prompts, all at once: through the endpoint (warm, after the load), then through
    the engine as `specctl generate` runs it (warmed up the same way)."""
    batch = [prompts[i % len(prompts)] for i in range(args.clients)]
    asyncio.run(run_batch(url, args.model, batch[:1], 8))  # warm-up
    endpoint = [
        asyncio.run(run_batch(url, args.model, batch, args.max_tokens))
        for _ in range(NUM_OVERHEAD_REPEATS)
    ]
    generate = _generate_runs(batch, args)
    num_tokens = endpoint[0][1]
    if any(n != num_tokens for _, n in endpoint + generate):
        raise RuntimeError(f"token counts differ between runs: {endpoint} vs {generate}")
    endpoint_s = statistics.median(s for s, _ in endpoint)
    generate_s = statistics.median(s for s, _ in generate)
    per_token_ms = (endpoint_s - generate_s) / num_tokens * 1000
    return Overhead(len(batch), num_tokens, endpoint_s, generate_s, per_token_ms)


def _generate_runs(prompts: list[str], args: argparse.Namespace) -> list[tuple[float, int]]:
    """What `specctl generate` runs, with the server's engine settings, warmed up like the
    server was: (engine seconds, tokens) per repeat."""
    import torch

    from daemon.runtime.engine.builder import EngineSpec, build_engine
    from daemon.runtime.engine.request import Request
    from daemon.runtime.sampling.params import SamplingParams
    from specctl.commands.generate import speculation_config

    torch.set_num_threads(args.threads)

    config = speculation_config(
        draft=args.draft,
        ngram=False,
        num_speculative_tokens=args.num_speculative_tokens,
        adaptive=False,
        max_batch_size=args.clients,
    )
    built = build_engine(
        EngineSpec(
            target=args.target,
            draft=args.draft,
            dtype="float32",
            max_model_len=args.max_model_len,
            engine=config,
        )
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    ids = [built.tokenizer.encode(p) for p in prompts]
    runs = []
    for repeat in range(NUM_OVERHEAD_REPEATS + 1):  # the first run warms up
        requests = [Request(f"{repeat}-{i}", p, params) for i, p in enumerate(ids)]
        start = time.perf_counter()
        outputs = built.engine.generate(requests)
        runs.append((time.perf_counter() - start, sum(len(o.token_ids) for o in outputs)))
    return runs[1:]


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(rows: list[LoadSummary]) -> None:
    header = ["server", "requests", "errors", "[DONE]", "tokens/s", "TTFT p50/p99 ms"]
    header += ["ITL p50/p99 ms", "TPOT p50 ms"]
    lines = [header]
    for r in rows:
        lines.append(
            [
                r.name,
                str(r.num_requests),
                str(r.num_errors),
                f"{r.num_done}/{r.num_requests}",
                _fmt(r.tokens_per_s),
                f"{_fmt(r.ttft_p50_ms)}/{_fmt(r.ttft_p99_ms)}",
                f"{_fmt(r.itl_p50_ms)}/{_fmt(r.itl_p99_ms)}",
                _fmt(r.tpot_p50_ms),
            ]
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    for row in lines:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    for r in rows:
        if r.first_error:
            print(f"{r.name}: first error: {r.first_error}")


def _vllm(
    spec: ServerSpec, args: argparse.Namespace, prompts: list[str], log_dir: Path
) -> tuple[LoadSummary | None, str | None]:
    """The same load against `vllm serve` on the same pair: (its row, or None and why not)."""
    missing = vllm_missing()
    if args.no_vllm or args.url:
        return None, "vLLM not run (--no-vllm or --url)"
    if missing:
        return None, missing
    try:
        vllm = start_vllm(spec, log_dir)
    except RuntimeError as exc:
        return None, f"vLLM failed to start: {' '.join(str(exc).split())[:300]}"
    try:
        return load("vllm serve", vllm.url, args, prompts), None
    finally:
        vllm.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    prompts = load_prompt_texts(DEMO_PROMPTS_CODE)
    spec = ServerSpec(
        args.target, args.draft, args.num_speculative_tokens, args.model, args.clients,
        args.max_model_len, threads=args.threads,
    )  # fmt: skip
    log_dir = args.out.parent
    log_dir.mkdir(parents=True, exist_ok=True)
    rows: list[LoadSummary] = []
    overhead: Overhead | None = None
    notes: list[str] = []
    if args.url:
        rows.append(load(f"server at {args.url}", args.url, args, prompts))
    else:
        server = start_specctl(spec, log_dir)
        try:
            rows.append(load("specctl serve", server.url, args, prompts))
            overhead = measure_overhead(server.url, args, prompts)
        finally:
            server.stop()
    vllm_row, note = _vllm(spec, args, prompts, log_dir)
    rows.extend([vllm_row] if vllm_row is not None else [])
    notes.extend([note] if note else [])
    print()
    print_table(rows)
    if overhead is not None:
        print(
            f"serving overhead: {overhead.num_prompts} prompts x {args.max_tokens} tokens at once: "
            f"endpoint {overhead.endpoint_s:.2f} s, specctl generate {overhead.generate_s:.2f} s "
            f"(medians of {NUM_OVERHEAD_REPEATS}): {overhead.per_token_ms:+.3f} ms per token"
        )
    for note in notes:
        print(note)
    report = {"rows": [asdict(r) for r in rows], "notes": notes, "args": vars(args)}
    report["overhead"] = asdict(overhead) if overhead else None
    args.out.write_text(json.dumps(report, indent=2, default=str))
    print(f"written {args.out}")
    return 0 if all(r.num_errors == 0 and r.num_done == r.num_requests for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
