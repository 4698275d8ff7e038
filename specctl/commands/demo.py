"""`specctl demo`: the main job on the bundled demo pair.

Speculative generation (draft on the demo draft, verification by the demo target) on held-out
code prompts, side by side with target-only decoding, showing the completions, acceptance
rate and tokens/s.
"""

from rich.table import Table

from bench.spec_engine import RunResult, SpecBench
from bench.workload import load_prompt_texts, tokenize
from specctl.console import make_console
from specctl.demo_pair import DEMO_PROMPTS_CODE, require_demo_pair


def run_demo(num_prompts: int, max_tokens: int, k: int, dtype: str) -> list[RunResult]:
    console = make_console()
    target, draft = require_demo_pair()
    console.print(f"[bold]specctl demo[/]: target {target}, draft {draft}")
    bench = SpecBench(target, draft, dtype, max_batch=1)
    texts = load_prompt_texts(DEMO_PROMPTS_CODE)[:num_prompts]
    prompts = tokenize(bench.tokenizer, texts)
    results = [
        bench.run("target-only", prompts, max_tokens, 1),
        bench.run(f"speculative k={k}", prompts, max_tokens, 1, k=k),
        bench.run(f"speculative adaptive k<={k}", prompts, max_tokens, 1, k=k, adaptive=True),
    ]
    spec = results[1]
    for text, ids in zip(texts[:2], spec.output_token_ids[:2], strict=False):
        console.rule("prompt")
        console.print(text, markup=False, highlight=False)
        console.rule("speculative completion")
        console.print(bench.tokenizer.decode(ids), markup=False, highlight=False)
    console.print(_table(results))
    same = all(r.output_token_ids == results[0].output_token_ids for r in results)
    console.print(f"greedy outputs identical to target-only decoding: {same}")
    return results


def _table(results: list[RunResult]) -> Table:
    table = Table(title="batch 1, greedy, held-out code prompts")
    for col in ("mode", "tokens", "tokens/s", "x target-only", "acceptance rate", "mean acc. len"):
        table.add_column(col, justify="right")
    base = results[0].tokens_per_s
    for r in results:
        table.add_row(
            r.mode,
            str(r.num_tokens),
            f"{r.tokens_per_s:.1f}",
            f"{r.tokens_per_s / base:.2f}",
            "-" if r.acceptance_rate is None else f"{r.acceptance_rate:.3f}",
            "-" if r.mean_acceptance_length is None else f"{r.mean_acceptance_length:.2f}",
        )
    return table
