"""`specctl bench`: specctl against target-only decoding and the engines users would pick instead.

Everything runs in one process (vLLM in a subprocess of it) on the same pair and the same
held-out prompts: specctl target-only, fixed-k and adaptive speculation at batch 1 and under
concurrency; transformers generate() and assisted generation; vLLM with and without draft-model
speculation when its virtualenv is installed (bench/setup_vllm_venv.sh).
"""

import json
import os
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from bench.costs import chain_ceiling, end_to_end_bound, pass_seconds, speedup_bound
from bench.machine import describe_machine
from bench.peers.result import PeerResult
from bench.spec_engine import RunResult, RunSpec, SpecBench
from bench.workload import load_prompt_texts, repeat_to, tokenize
from daemon.runtime.engine.builder import load_tokenizer
from daemon.runtime.engine.graphs_ahead import GraphCapture
from daemon.runtime.model.protocol import CausalLM

SHAPE_DESCRIPTIONS = {
    "narrow": "narrow: the demo target plus many zero-output layers of its width (many small "
    "ops: per-op and per-round overhead dominate)",
    "wide": "wide: the demo target with its MLPs widened by zero-output units, float32, "
    "weights well past the last-level cache (a decode step is bound by reading weights, as a "
    "large model's is on a GPU; verifying k+1 tokens should cost about one step)",
}


@dataclass(slots=True)
class BenchConfig:
    target: Path
    draft: Path
    code_prompts: Path
    prose_prompts: Path | None
    out_dir: Path
    num_prompts: int = 8
    max_tokens: int = 64
    k: int = 4  # the peers' k, and the fixed k of the analytic bound
    sweep_ks: list[int] = field(default_factory=lambda: [1, 2, 4, 6])  # fixed k beside adaptive
    concurrencies: list[int] = field(default_factory=lambda: [1, 4, 16, 32])
    dtype: str = "float32"
    peers: bool = True
    vllm_timeout_s: float = 1800.0
    threads: int | None = None  # torch intra-op threads (and vLLM's OMP threads)
    shape: str = "custom"  # "narrow" | "wide" | "custom": which cost-scaled target this is
    repeats: int = 3  # measured runs per specctl configuration (the median is reported)
    device: str = "cpu"  # where specctl and transformers run ("cuda": vLLM's CPU peer is skipped)
    temperature: float = 0.0  # 0: greedy (outputs compared); above: every engine samples at it


@dataclass(slots=True)
class Row:
    """One line of the report table."""

    engine: str
    mode: str
    concurrency: int
    prompts: str  # "code" | "prose"
    tokens_per_s: float
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    num_tokens: int
    note: str = ""
    ratio: float | None = None  # tokens/s over specctl target-only at the same concurrency
    repeats: list[float] = field(default_factory=list)  # each repeat's tokens/s, in run order
    # specctl's rows (the median repeat's): time a round spends outside its forward passes,
    # and the part of it the controller took choosing k (None: a peer's row)
    overhead_per_round_ms: float | None = None
    choose_per_round_us: float | None = None


def from_run(r: RunResult, prompts: str) -> Row:
    spread = r.repeats_tokens_per_s
    note = f"median of {len(spread)}: {spread[0]:.1f}-{spread[-1]:.1f}" if len(spread) > 1 else ""
    return Row(
        "specctl",
        r.mode,
        r.concurrency,
        prompts,
        r.tokens_per_s,
        r.acceptance_rate,
        r.mean_acceptance_length,
        r.num_tokens,
        note,
        repeats=list(r.repeats_in_order),
        overhead_per_round_ms=r.overhead_per_round_ms,
        choose_per_round_us=r.choose_per_round_us,
    )


def from_peer(p: PeerResult, prompts: str, concurrency: int = 1) -> Row:
    return Row(
        p.engine,
        p.mode,
        concurrency,
        prompts,
        p.tokens_per_s,
        p.acceptance_rate,
        p.mean_acceptance_length,
        p.num_tokens,
        p.note,
    )


def fixed_ks(cfg: BenchConfig) -> list[int]:
    return sorted(set(cfg.sweep_ks) | {cfg.k})


def group_specs(cfg: BenchConfig) -> list[RunSpec]:
    """The configurations run side by side: target-only, every fixed k, adaptive (ceiling:
    the largest fixed k)."""
    specs = [RunSpec("target-only")]
    specs += [RunSpec(f"spec k={k}", k) for k in fixed_ks(cfg)]
    return [*specs, RunSpec("spec adaptive", max(fixed_ks(cfg)), adaptive=True)]


def context_len(prompt_sets: dict[str, list[list[int]]], cfg: BenchConfig) -> int:
    """The KV cache's context per slot: the longest prompt, its new tokens and a round's
    drafts past them, rounded up to 64. The checkpoint's 2,048 at 32 sequences times every
    configuration (the groups run side by side, each in its own slots) would take 6.5 GB on
    the narrow target; the workload uses a sixth of it."""
    longest = max(len(p) for prompts in prompt_sets.values() for p in prompts)
    return -(-(longest + cfg.max_tokens + max(fixed_ks(cfg)) + 1) // 64) * 64


def specctl_rows(
    bench: SpecBench, cfg: BenchConfig, prompt_sets: dict[str, list[list[int]]]
) -> tuple[list[Row], list[RunResult]]:
    """Per prompt set and concurrency: target-only, every fixed k, adaptive (ceiling: the
    largest fixed k), side by side on the same loaded models, their repeats interleaved."""
    rows: list[Row] = []
    runs: list[RunResult] = []
    specs = group_specs(cfg)
    for name, prompts in prompt_sets.items():
        for conc in cfg.concurrencies:
            work = prompts if conc == 1 else repeat_to(prompts, conc)
            group = bench.run_group(specs, work, cfg.max_tokens, conc, cfg.repeats, cfg.temperature)
            rows += [from_run(r, name) for r in group]
            if name == "code":
                runs += group
    return rows, runs


def paired_ratio(a: Row, b: Row) -> float | None:
    """The median over repeats of a's tokens/s over b's in the same repeat (None without two
    or more repeats each). Repeat i of each ran beside the other's (request by request at
    concurrency 1, step by step above: SpecBench.run_group): a slow spell of the machine,
    which halved a run here, falls on both sides of the ratio, instead of on whichever
    configuration ran then."""
    if len(a.repeats) != len(b.repeats) or len(a.repeats) < 2:
        return None
    return statistics.median(x / y for x, y in zip(a.repeats, b.repeats, strict=True))


def adaptive_summary(rows: list[Row]) -> list[dict[str, object]]:
    """Adaptive against the best fixed k and against target-only, per prompt set and
    concurrency (the same run's figures): the ratio of medians, and the median of the
    repeats' paired ratios (paired_ratio)."""
    out: list[dict[str, object]] = []
    for prompts, conc in sorted(
        {(r.prompts, r.concurrency) for r in rows if r.engine == "specctl"}
    ):
        group = [
            r
            for r in rows
            if r.engine == "specctl" and (r.prompts, r.concurrency) == (prompts, conc)
        ]
        fixed = [r for r in group if r.mode.startswith("spec k=")]
        adaptive = next((r for r in group if r.mode == "spec adaptive"), None)
        plain = next((r for r in group if r.mode == "target-only"), None)
        if not fixed or adaptive is None or plain is None:
            continue
        best = max(fixed, key=lambda r: r.tokens_per_s)
        out.append(
            {
                "prompts": prompts,
                "concurrency": conc,
                "best_fixed": best.mode,
                "best_fixed_tokens_per_s": best.tokens_per_s,
                "adaptive_tokens_per_s": adaptive.tokens_per_s,
                "adaptive_over_best_fixed": adaptive.tokens_per_s / best.tokens_per_s,
                "adaptive_over_target_only": adaptive.tokens_per_s / plain.tokens_per_s,
                "adaptive_over_best_fixed_paired": paired_ratio(adaptive, best),
                "adaptive_over_target_only_paired": paired_ratio(adaptive, plain),
            }
        )
    return out


def peer_rows(cfg: BenchConfig, code: list[list[int]]) -> tuple[list[Row], list[str]]:
    """transformers (batch 1) and vLLM (every concurrency) on the same prompts. A peer that
    fails is reported in a note: it never costs the rest of the report."""
    from bench.peers.hf_peer import run_hf_assisted, run_hf_generate
    from bench.peers.vllm_runner import run_vllm, vllm_available

    runs: list[tuple[str, int, Callable[[], PeerResult]]] = [
        ("generate", 1, lambda: run_hf_generate(cfg.target, code, cfg.max_tokens,
                                                dtype=cfg.dtype, device=cfg.device,
                                                temperature=cfg.temperature)),
        (f"assisted k={cfg.k}", 1, lambda: run_hf_assisted(
            cfg.target, cfg.draft, code, cfg.max_tokens, num_assistant_tokens=cfg.k,
            dtype=cfg.dtype, device=cfg.device, temperature=cfg.temperature)),
    ]  # fmt: skip
    notes: list[str] = []
    ok, reason = vllm_available()
    if ok and cfg.device != "cpu":
        ok, reason = False, f"the vLLM peer is its CPU build; specctl ran on {cfg.device}"
    if ok:
        for conc in cfg.concurrencies:
            work = code if conc == 1 else repeat_to(code, conc)
            for name, draft in (("no speculation", None), (f"draft_model k={cfg.k}", cfg.draft)):
                runs.append((name, conc, _vllm_run(cfg, draft, work, conc, run_vllm)))
    else:
        notes.append(f"vLLM not run: {reason}")
    rows: list[Row] = []
    for name, conc, run in runs:
        try:
            row = from_peer(run(), "code", conc)
            row.mode = name  # e.g. "draft_model k=4": the peer's own mode is only "sequential"
            rows.append(row)
        except Exception as exc:  # a peer's failure is a finding to report, not a crash
            notes.append(f"peer run '{name}' at concurrency {conc} failed: "
                         f"{type(exc).__name__}: {exc}")  # fmt: skip
    return rows, notes


def _vllm_run(
    cfg: BenchConfig,
    draft: Path | None,
    work: list[list[int]],
    conc: int,
    run_vllm: Callable[..., PeerResult],
) -> Callable[[], PeerResult]:
    return lambda: run_vllm(
        cfg.target, draft, cfg.k, work, cfg.max_tokens, conc, cfg.vllm_timeout_s,
        temperature=cfg.temperature,
    )  # fmt: skip


def add_ratios(rows: list[Row]) -> None:
    base = {
        (r.concurrency, r.prompts): r.tokens_per_s
        for r in rows
        if r.engine == "specctl" and r.mode == "target-only"
    }
    for r in rows:
        ref = base.get((r.concurrency, r.prompts))
        r.ratio = r.tokens_per_s / ref if ref else None


def capture_note(captures: list[GraphCapture]) -> str:
    """What the engines captured as CUDA graphs before their first requests."""
    seconds = sorted(c.seconds for c in captures)
    return (
        f"CUDA graphs captured at engine start by {len(captures)} engines: "
        f"{min(c.num_graphs for c in captures)}-{max(c.num_graphs for c in captures)} graphs "
        f"each, in {seconds[0]:.2f}-{seconds[-1]:.2f} s (median {statistics.median(seconds):.2f} s)"
    )


def run_bench(cfg: BenchConfig) -> dict[str, object]:
    """Every engine on one target shape; the report as a dict (see write_report)."""
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
        # the vLLM peer inherits these: OpenMP threads, bound to as many cores
        os.environ["OMP_NUM_THREADS"] = str(cfg.threads)
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{cfg.threads - 1}"
    tokenizer = load_tokenizer(cfg.target)
    sets = {"code": cfg.code_prompts, "prose": cfg.prose_prompts}
    prompt_sets = {
        name: tokenize(tokenizer, load_prompt_texts(path)[: cfg.num_prompts])
        for name, path in sets.items()
        if path is not None
    }
    bench = SpecBench(
        cfg.target,
        cfg.draft,
        cfg.dtype,
        max(cfg.concurrencies),
        cfg.device,
        num_engines=len(group_specs(cfg)),
        max_model_len=context_len(prompt_sets, cfg),
    )
    code = prompt_sets["code"]
    rows, runs = specctl_rows(bench, cfg, prompt_sets)
    notes: list[str] = []
    if cfg.peers:
        more, notes = peer_rows(cfg, code)
        rows += more
    if bench.graph_captures:
        notes.append(capture_note(bench.graph_captures))
    add_ratios(rows)
    # the analytic bound models batch 1; greedy outputs are compared at the smallest concurrency
    # (sampled ones are draws: the distribution tests check those)
    lowest = min(cfg.concurrencies)
    plain = next(r for r in runs if r.concurrency == lowest and r.mode == "target-only")
    return {
        "shape": cfg.shape,
        "shape_description": SHAPE_DESCRIPTIONS.get(cfg.shape, str(cfg.target)),
        "config": {k: str(v) for k, v in asdict(cfg).items()},
        "rows": [asdict(r) for r in rows],
        "adaptive": adaptive_summary(rows),
        "forward_curve": forward_curve(bench.target),
        "bound": batch1_bound(bench, cfg, runs, code) if lowest == 1 else None,
        "lossless_concurrency": lowest,
        "temperature": cfg.temperature,
        "lossless": all(
            r.output_token_ids == plain.output_token_ids for r in runs if r.concurrency == lowest
        )
        if cfg.temperature == 0
        else None,
        "notes": notes,
    }


def batch1_bound(
    bench: SpecBench, cfg: BenchConfig, runs: list[RunResult], prompts: list[list[int]]
) -> dict[str, float | None]:
    """The analytic speedup bound at batch 1 (fitted to the fixed-k run) beside the measured
    speedup, end to end and decoding alone, and the ceiling of any chain of drafts (greedy;
    `prompts`: the code prompts the runs decoded, in their order)."""
    fixed = next(r for r in runs if r.concurrency == 1 and r.mode == f"spec k={cfg.k}")
    plain = next(r for r in runs if r.concurrency == 1 and r.mode == "target-only")
    alpha = fixed.per_position_acceptance(cfg.k) or 0.0
    bound = speedup_bound(bench.target, bench.draft, alpha, cfg.k)
    measured = fixed.tokens_per_s / plain.tokens_per_s
    # The bound models decoding; the runs' wall time also holds their prompts' prefill, the
    # same work in both (about a third of a batch-1 speculative run on the wide target).
    decode = (plain.wall_s - plain.prefill_time_s) / (fixed.wall_s - fixed.prefill_time_s)
    end_to_end = end_to_end_bound(plain.wall_s, plain.prefill_time_s, bound.speedup)
    # greedy: the ceiling is counted on target-only's outputs (sampled ones would need the
    # target's distributions to say what a draft could have had accepted)
    ceiling = (
        chain_ceiling(bench.draft, prompts, plain.output_token_ids)
        if cfg.temperature == 0
        else None
    )  # (None too where nothing was decoded: --max-tokens 1)
    return {
        **asdict(bound),
        "cost_ratio": bound.cost_ratio,
        "speedup_bound": bound.speedup,
        "measured_speedup": measured,
        "efficiency": measured / bound.speedup,
        "end_to_end_bound": end_to_end,
        "end_to_end_efficiency": measured / end_to_end,
        "measured_decode_speedup": decode,
        "decode_efficiency": decode / bound.speedup,
        "prefill_share": fixed.prefill_time_s / fixed.wall_s,
        "chain_ceiling": ceiling,
        "end_to_end_ceiling": None
        if ceiling is None
        else end_to_end_bound(plain.wall_s, plain.prefill_time_s, ceiling),
    }


def forward_curve(target: CausalLM, batches: tuple[int, ...] = (1, 4, 16)) -> dict[str, list]:
    """time(t tokens) / time(1 token) of one target pass, t = 1..9, per batch size."""
    curve: dict[str, list] = {}
    for batch in batches:
        if batch > target.num_slots:
            continue
        # interleaved: every t in each repeat, so a ratio is not the machine's drift
        seconds = pass_seconds([(target, t) for t in range(1, 10)], batch=batch, repeats=8)
        ms = [1000 * s for s in seconds]
        curve[str(batch)] = [{"t": t + 1, "ms": m, "over_t1": m / ms[0]} for t, m in enumerate(ms)]
    return curve


def write_report(out_dir: Path, reports: list[dict[str, object]], threads: int | None) -> Path:
    """bench.json: the machine, then one report per target shape."""
    path = out_dir / "bench.json"
    data = {"machine": describe_machine(threads), "shapes": reports}
    path.write_text(json.dumps(data, indent=2))
    return path
