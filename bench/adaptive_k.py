"""Adaptive k against every fixed k, in one run: does the controller find what pays?

    python -m bench.adaptive_k [--cost-ratio 30 | --wide] [--concurrency 1,4,16,32] [--max-k 6]

For each prompt set (code, prose) and each concurrency it runs target-only, speculative with
every fixed k from 1 to --max-k, and adaptive with ceiling --max-k, on the demo pair (or the
cost-scaled demo target with --cost-ratio, the one `specctl bench` builds), greedy, EOS
ignored (every mode generates the same tokens), one torch thread. It prints tokens/s per mode,
the best fixed k, adaptive over the best fixed k and over target-only, and the controller's
time choosing k per round (a share of a round that matters where rounds take a few ms: the
demo pair here, a GPU), and writes the rows as JSON. Figures taken while other work shares
the CPU are noisy: say so when quoting.
"""

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bench.spec_engine import SpecBench
from bench.workload import load_prompt_texts, repeat_to, tokenize
from specctl.demo_pair import DEMO_PROMPTS_CODE, DEMO_PROMPTS_PROSE, require_demo_pair

PROMPT_SETS = {"code": DEMO_PROMPTS_CODE, "prose": DEMO_PROMPTS_PROSE}


@dataclass(slots=True)
class Row:
    prompts: str
    concurrency: int
    mode: str  # "target-only", "k=3", "adaptive<=6"
    tokens_per_s: float
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    mean_k: float | None  # draft tokens per draft (adaptive: what it chose)
    choose_us: float  # the controller's time choosing k, per round


def run(
    bench: SpecBench, prompts: list[list[int]], name: str, c: int, max_k: int, max_tokens: int
) -> list[Row]:
    batch = repeat_to(prompts, max(len(prompts), 2 * c))
    modes = [("target-only", 0, False)]
    modes += [(f"k={k}", k, False) for k in range(1, max_k + 1)]
    modes += [(f"adaptive<={max_k}", max_k, True)]
    rows = []
    for mode, k, adaptive in modes:
        result = bench.run(mode, batch, max_tokens, c, k=k, adaptive=adaptive)
        accepted = sum(result.accepted_per_pos)
        mean_k = (
            accepted / result.acceptance_rate / result.num_drafts
            if result.num_drafts and result.acceptance_rate
            else None
        )
        rows.append(
            Row(
                name,
                c,
                mode,
                result.tokens_per_s,
                result.acceptance_rate,
                result.mean_acceptance_length,
                mean_k,
                result.choose_per_round_us,
            )
        )
        print(
            f"  {name:5s} c={c:<3d} {mode:12s} {result.tokens_per_s:8.1f} tok/s  "
            f"choose() {result.choose_per_round_us:6.1f} us/round",
            flush=True,
        )
    return rows


def summarise(rows: list[Row]) -> list[str]:
    lines = []
    for name in PROMPT_SETS:
        for c in sorted({r.concurrency for r in rows}):
            group = [r for r in rows if r.prompts == name and r.concurrency == c]
            if not group:
                continue
            base = next(r for r in group if r.mode == "target-only").tokens_per_s
            fixed = [r for r in group if r.mode.startswith("k=")]
            best = max(fixed, key=lambda r: r.tokens_per_s)
            adaptive = next(r for r in group if r.mode.startswith("adaptive"))
            lines.append(
                f"{name:5s} c={c:<3d} target-only {base:7.1f}  best fixed {best.mode:5s} "
                f"{best.tokens_per_s:7.1f}  adaptive {adaptive.tokens_per_s:7.1f} "
                f"(k~{adaptive.mean_k or 0:.2f})  "
                f"adaptive/best {adaptive.tokens_per_s / best.tokens_per_s:.3f}  "
                f"adaptive/target-only {adaptive.tokens_per_s / base:.2f}  "
                f"choose() {adaptive.choose_us:.1f} us/round"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cost-ratio", type=float, default=0.0, help="0: the plain demo pair")
    parser.add_argument("--wide", action="store_true", help="the wide cost-scaled target")
    parser.add_argument("--concurrency", default="1,4,16,32")
    parser.add_argument("--max-k", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompts", default="code,prose")
    parser.add_argument("--out", type=Path, default=Path(".bench-out"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, draft = require_demo_pair()
    if args.cost_ratio or args.wide:
        from specctl.commands.bench import resolve_target, resolve_wide_target
        from specctl.console import make_console

        if args.wide:
            target = resolve_wide_target(args.out, make_console())
        else:
            target = resolve_target(None, args.cost_ratio, args.out, make_console())
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    bench = SpecBench(target, draft, "float32", max_batch=max(concurrencies))
    rows: list[Row] = []
    for name in args.prompts.split(","):
        texts = load_prompt_texts(PROMPT_SETS[name])
        prompts = tokenize(bench.tokenizer, texts)
        for c in concurrencies:
            rows += run(bench, prompts, name, c, args.max_k, args.max_tokens)
    print()
    for line in summarise(rows):
        print(line)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "adaptive_k.json"
    out.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
