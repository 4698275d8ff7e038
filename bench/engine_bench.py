"""Engine benchmark: target-only vs speculative decoding at batch 1 and 16, side by side.

    python -m bench.engine_bench [--target DIR --draft DIR] [--prompts FILE] [--max-tokens N]

Prints tokens/s, the ratio to target-only at the same concurrency, acceptance rate, mean
acceptance length, and the per-round engine overhead outside the model forward passes.
"""

import argparse
import json
from pathlib import Path

import torch
from rich.table import Table

from bench.arg_types import add_pair_arguments, positive_int, positive_int_list
from bench.spec_engine import RunResult, RunSpec, SpecBench
from bench.workload import load_prompt_texts, repeat_to, tokenize
from daemon.runtime.errors import SpecError
from specctl.console import make_console


def run_engine_bench(
    bench: SpecBench,
    prompts: list[list[int]],
    max_tokens: int,
    concurrencies: list[int],
    k: int,
    repeats: int = 3,
) -> list[RunResult]:
    """Target-only, fixed k and adaptive at each concurrency, side by side (run_group: step
    by step, or request by request at concurrency 1), the median of `repeats`. Measured one
    after another, as they were, the ratios moved with the machine's minute: fixed k at one
    request gave 0.95x and 1.43x target-only in two runs of a few seconds."""
    results: list[RunResult] = []
    specs = [
        RunSpec("target-only"),
        RunSpec(f"spec k={k}", k),
        RunSpec(f"spec adaptive<={k}", k, adaptive=True),
    ]
    for conc in concurrencies:
        work = repeat_to(prompts, max(conc, len(prompts)) if conc > 1 else len(prompts))
        results += bench.run_group(specs, work, max_tokens, conc, repeats)
    return results


def results_table(results: list[RunResult], title: str) -> Table:
    table = Table(title=title)
    for col in (
        "concurrency",
        "mode",
        "tokens/s",
        "x target-only",
        "acceptance",
        "mean acc. len",
        "rounds",
        "overhead/round ms",
        "draft s",
        "verify s",
    ):
        table.add_column(col, justify="right")
    base = {r.concurrency: r.tokens_per_s for r in results if r.mode == "target-only"}
    for r in results:
        table.add_row(
            str(r.concurrency),
            r.mode,
            f"{r.tokens_per_s:.1f}",
            f"{r.tokens_per_s / base[r.concurrency]:.2f}" if r.concurrency in base else "-",
            "-" if r.acceptance_rate is None else f"{r.acceptance_rate:.3f}",
            "-" if r.mean_acceptance_length is None else f"{r.mean_acceptance_length:.2f}",
            str(r.num_rounds),
            f"{r.overhead_per_round_ms:.2f}",
            f"{r.draft_time_s:.2f}",
            f"{r.verify_time_s:.2f}",
        )
    return table


def outputs_identical(results: list[RunResult]) -> bool:
    """Greedy decoding is lossless: every mode at a concurrency produced the same tokens."""
    by_conc: dict[int, list[list[int]]] = {}
    same = True
    for r in results:
        ref = by_conc.setdefault(r.concurrency, r.output_token_ids)
        same &= ref == r.output_token_ids
    return same


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    add_pair_arguments(parser)
    parser.add_argument("--num-prompts", type=positive_int, default=4)
    parser.add_argument("--max-tokens", type=positive_int, default=64)
    parser.add_argument("--k", type=positive_int, default=4)
    parser.add_argument("--concurrency", type=positive_int_list, default=[1, 16])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--repeats", type=positive_int, default=3, help="Measured runs; the median is shown."
    )
    parser.add_argument("--json", type=Path, default=None, help="Write the results here.")
    parser.add_argument(
        "--threads", type=positive_int, default=None, help="torch intra-op threads."
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    concurrencies = args.concurrency
    try:
        bench = SpecBench(args.target, args.draft, args.dtype, max(concurrencies), num_engines=3)
    except SpecError as exc:
        parser.error(str(exc))
    prompts = tokenize(bench.tokenizer, load_prompt_texts(args.prompts)[: args.num_prompts])
    results = run_engine_bench(bench, prompts, args.max_tokens, concurrencies, args.k, args.repeats)
    console = make_console()
    console.print(results_table(results, f"specctl engine: {args.target.name} + {args.draft.name}"))
    console.print(f"greedy outputs identical across modes: {outputs_identical(results)}")
    if args.json:
        args.json.write_text(json.dumps([r.summary() for r in results], indent=2))


if __name__ == "__main__":
    from specctl.quiet_exit import run_and_exit

    run_and_exit(main)
