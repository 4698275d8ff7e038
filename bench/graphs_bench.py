"""Static-shape passes (CUDA graphs on a GPU) against the ragged eager forward, side by side.

    python -m bench.graphs_bench [--device cuda] [--target DIR --draft DIR] [--concurrency 1,16]

Loads the pair twice on the device: once with static passes (captured as CUDA graphs on a
GPU, run eagerly on a CPU, where they only add padding), once with every pass eager. Then, in
one run, target-only and speculative decoding (fixed k) at each concurrency on both, their
repeats interleaved, and the target's forward time for t = 1..9 new tokens at batch 1 on
both. Prints tokens/s, the static/eager ratio, speculative/target-only, acceptance and the
graph shapes captured (batch bucket x tokens per row), and writes them as JSON with --json.
"""

import argparse
import json
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from bench.arg_types import (
    DEVICES,
    add_pair_arguments,
    device_problem,
    positive_int,
    positive_int_list,
)
from bench.costs import pass_seconds
from bench.machine import describe_machine
from bench.spec_engine import RunResult, RunSpec, SpecBench, median_run
from bench.workload import load_prompt_texts, repeat_to, tokenize
from daemon.runtime.errors import SpecError
from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.runtime.model.protocol import CausalLM

VARIANTS = ("static", "eager")


def _lean(model: CausalLM) -> LlamaForCausalLM:
    if not isinstance(model, LlamaForCausalLM):
        raise SpecError(f"static passes need the lean runner, got {type(model).__name__}")
    return model


def load_variants(target: Path, draft: Path, device: str, max_batch: int) -> dict[str, SpecBench]:
    """The pair loaded twice: static passes on (graphs where the device has them), and off."""
    benches: dict[str, SpecBench] = {}
    for variant in VARIANTS:
        bench = SpecBench(target, draft, "float32", max_batch, device)
        for model in (_lean(bench.target), _lean(bench.draft)):
            if variant == "eager":
                model.static = None
            elif model.static is None:  # a CPU (or graphs turned off): static, uncaptured
                model.enable_static_passes(capture=False)
        benches[variant] = bench
    return benches


def run_side_by_side(
    benches: dict[str, SpecBench],
    prompts: list[list[int]],
    max_tokens: int,
    concurrencies: list[int],
    k: int,
    repeats: int,
) -> list[tuple[str, RunResult]]:
    """Per concurrency, target-only and spec k on each variant; each variant's repeats run
    round-robin with the other's (`run_group` per repeat), so a slow spell costs both."""
    specs = [RunSpec("target-only"), RunSpec(f"spec k={k}", k)]
    out: list[tuple[str, RunResult]] = []
    for conc in concurrencies:
        work = prompts if conc == 1 else repeat_to(prompts, conc)
        per_variant: dict[str, list[list[RunResult]]] = {v: [] for v in benches}
        for _ in range(repeats):
            for variant, bench in benches.items():
                per_variant[variant].append(bench.run_group(specs, work, max_tokens, conc, 1))
        for variant, runs in per_variant.items():
            for i in range(len(specs)):
                out.append((variant, median_run([r[i] for r in runs])))
    return out


def forward_curves(benches: dict[str, SpecBench]) -> dict[str, list[float]]:
    """ms of one target pass of t = 1..9 tokens at batch 1, per variant."""
    return {
        variant: [
            1000 * s for s in pass_seconds([(bench.target, t) for t in range(1, 10)], repeats=10)
        ]
        for variant, bench in benches.items()
    }


def graph_shapes(bench: SpecBench) -> dict[str, list[list[int]]]:
    """(batch bucket, tokens per row) of each captured graph, per model."""
    shapes: dict[str, list[list[int]]] = {}
    for name, model in (("target", bench.target), ("draft", bench.draft)):
        static = _lean(model).static
        graphs = static.graphs if static is not None else {}
        shapes[name] = [list(pair) for pair in sorted({(s.batch, s.chunk) for s in graphs})]
    return shapes


def results_table(results: list[tuple[str, RunResult]], device: str) -> Table:
    table = Table(title=f"static (graphs on CUDA) vs eager passes, {device}, greedy")
    for col in ("conc.", "mode", "variant", "tokens/s", "static/eager", "x target-only",
                "acceptance", "repeats"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("mode", "variant") else "right")
    tps = {(v, r.concurrency, r.mode): r.tokens_per_s for v, r in results}
    for variant, r in results:
        eager = tps.get(("eager", r.concurrency, r.mode))
        plain = tps.get((variant, r.concurrency, "target-only"))
        table.add_row(
            str(r.concurrency),
            r.mode,
            variant,
            f"{r.tokens_per_s:.1f}",
            f"{r.tokens_per_s / eager:.2f}" if eager else "-",
            f"{r.tokens_per_s / plain:.2f}" if plain else "-",
            "-" if r.acceptance_rate is None else f"{r.acceptance_rate:.3f}",
            " ".join(f"{t:.0f}" for t in r.repeats_tokens_per_s),
        )
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=DEVICES, default="cuda")
    add_pair_arguments(parser)
    parser.add_argument("--num-prompts", type=positive_int, default=8)
    parser.add_argument("--max-tokens", type=positive_int, default=64)
    parser.add_argument("-k", type=positive_int, default=4)
    parser.add_argument("--concurrency", type=positive_int_list, default=[1, 4, 16])
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--threads", type=positive_int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="Write the figures here.")
    args = parser.parse_args(argv)
    problem = device_problem(args.device)
    if problem:
        parser.error(problem)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        benches = load_variants(args.target, args.draft, args.device, max(args.concurrency))
    except SpecError as exc:
        parser.error(str(exc))
    tokenizer = benches["static"].tokenizer
    prompts = tokenize(tokenizer, load_prompt_texts(args.prompts)[: args.num_prompts])
    results = run_side_by_side(
        benches, prompts, args.max_tokens, args.concurrency, args.k, args.repeats
    )
    curves = forward_curves(benches)
    report(results, curves, benches, args, Console())


def report(
    results: list[tuple[str, RunResult]],
    curves: dict[str, list[float]],
    benches: dict[str, SpecBench],
    args: argparse.Namespace,
    console: Console,
) -> None:
    console.print(results_table(results, args.device))
    for variant, ms in curves.items():
        figures = " ".join(f"{m:.2f}" for m in ms)
        console.print(f"target forward ms, t = 1..9, batch 1, {variant}: {figures}")
    console.print(
        "static/eager forward: "
        + " ".join(f"{s / e:.2f}" for s, e in zip(curves["static"], curves["eager"], strict=True))
    )
    shapes = graph_shapes(benches["static"])
    console.print(f"CUDA graphs captured (batch bucket, tokens per row): {shapes}")
    same = {r.concurrency: r.output_token_ids for v, r in results if r.mode == "target-only"}
    lossless = all(r.output_token_ids == same[r.concurrency] for _, r in results)
    console.print(f"greedy outputs identical across variants and modes: {lossless}")
    if args.json:
        data = {
            "machine": describe_machine(args.threads),
            "device": args.device,
            "runs": [{"variant": v, **r.summary()} for v, r in results],
            "forward_ms": curves,
            "graph_shapes": shapes,
            "lossless": lossless,
        }
        args.json.write_text(json.dumps(data, indent=2))
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    from specctl.quiet_exit import run_and_exit

    run_and_exit(main)
