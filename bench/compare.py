"""`specctl bench`: specctl against target-only decoding and the engines users would pick instead.

Everything runs in one process (vLLM in a subprocess of it) on the same pair and the same
held-out prompts: specctl target-only, fixed-k and adaptive speculation at batch 1 and under
concurrency; transformers generate() and assisted generation; vLLM with and without draft-model
speculation when its virtualenv is installed (bench/setup_vllm_venv.sh).
"""

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from bench.costs import speedup_bound
from bench.peers.result import PeerResult
from bench.spec_engine import RunResult, SpecBench
from bench.workload import load_prompt_texts, repeat_to, tokenize


@dataclass(slots=True)
class BenchConfig:
    target: Path
    draft: Path
    code_prompts: Path
    prose_prompts: Path | None
    out_dir: Path
    num_prompts: int = 8
    max_tokens: int = 64
    k: int = 4
    concurrencies: list[int] = field(default_factory=lambda: [1, 4, 16, 32])
    dtype: str = "float32"
    peers: bool = True
    vllm_timeout_s: float = 1800.0
    threads: int | None = None  # torch intra-op threads (and vLLM's OMP threads)


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


def from_run(r: RunResult, prompts: str) -> Row:
    return Row(
        "specctl",
        r.mode,
        r.concurrency,
        prompts,
        r.tokens_per_s,
        r.acceptance_rate,
        r.mean_acceptance_length,
        r.num_tokens,
    )


def from_peer(p: PeerResult, prompts: str) -> Row:
    return Row(
        p.engine,
        p.mode,
        1,
        prompts,
        p.tokens_per_s,
        p.acceptance_rate,
        p.mean_acceptance_length,
        p.num_tokens,
        p.note,
    )


def specctl_rows(
    bench: SpecBench, cfg: BenchConfig, code: list[list[int]]
) -> tuple[list[Row], list[RunResult]]:
    runs: list[RunResult] = []
    for conc in cfg.concurrencies:
        work = code if conc == 1 else repeat_to(code, conc)
        runs.append(bench.run("target-only", work, cfg.max_tokens, conc))
        runs.append(bench.run(f"spec k={cfg.k}", work, cfg.max_tokens, conc, k=cfg.k))
        runs.append(bench.run("spec adaptive", work, cfg.max_tokens, conc, k=cfg.k, adaptive=True))
    return [from_run(r, "code") for r in runs], runs


def prose_rows(bench: SpecBench, cfg: BenchConfig) -> list[Row]:
    if cfg.prose_prompts is None:
        return []
    prose = tokenize(bench.tokenizer, load_prompt_texts(cfg.prose_prompts)[: cfg.num_prompts])
    runs = [
        bench.run("target-only", prose, cfg.max_tokens, 1),
        bench.run(f"spec k={cfg.k}", prose, cfg.max_tokens, 1, k=cfg.k),
    ]
    return [from_run(r, "prose") for r in runs]


def peer_rows(cfg: BenchConfig, code: list[list[int]]) -> tuple[list[Row], list[str]]:
    """transformers and vLLM on the same prompts. A peer that fails is reported in a note:
    it never costs the rest of the report."""
    from bench.peers.hf_peer import run_hf_assisted, run_hf_generate
    from bench.peers.vllm_runner import run_vllm, vllm_available

    runs: list[tuple[str, Callable[[], PeerResult]]] = [
        ("generate", lambda: run_hf_generate(cfg.target, code, cfg.max_tokens,
                                                          dtype=cfg.dtype)),
        (f"assisted k={cfg.k}", lambda: run_hf_assisted(
            cfg.target, cfg.draft, code, cfg.max_tokens, num_assistant_tokens=cfg.k,
            dtype=cfg.dtype)),
    ]  # fmt: skip
    notes: list[str] = []
    ok, reason = vllm_available()
    if ok:
        timeout = cfg.vllm_timeout_s
        runs.append(
            (
                "no speculation",
                lambda: run_vllm(cfg.target, None, cfg.k, code, cfg.max_tokens, 1, timeout),
            )
        )
        runs.append(
            (
                f"draft_model k={cfg.k}",
                lambda: run_vllm(cfg.target, cfg.draft, cfg.k, code, cfg.max_tokens, 1, timeout),
            )
        )
    else:
        notes.append(f"vLLM not run: {reason}")
    rows: list[Row] = []
    for name, run in runs:
        try:
            row = from_peer(run(), "code")
            row.mode = name  # e.g. "draft_model k=4": the peer's own mode is only "sequential"
            rows.append(row)
        except Exception as exc:  # a peer's failure is a finding to report, not a crash
            notes.append(f"peer run '{name}' failed: {type(exc).__name__}: {exc}")
    return rows, notes


def add_ratios(rows: list[Row]) -> None:
    base = {
        (r.concurrency, r.prompts): r.tokens_per_s
        for r in rows
        if r.engine == "specctl" and r.mode == "target-only"
    }
    for r in rows:
        ref = base.get((r.concurrency, r.prompts))
        r.ratio = r.tokens_per_s / ref if ref else None


def run_bench(cfg: BenchConfig) -> dict[str, object]:
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
        # the vLLM peer inherits these: OpenMP threads, bound to as many cores
        os.environ["OMP_NUM_THREADS"] = str(cfg.threads)
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{cfg.threads - 1}"
    bench = SpecBench(cfg.target, cfg.draft, cfg.dtype, max(cfg.concurrencies))
    code = tokenize(bench.tokenizer, load_prompt_texts(cfg.code_prompts)[: cfg.num_prompts])
    rows, runs = specctl_rows(bench, cfg, code)
    rows += prose_rows(bench, cfg)
    notes: list[str] = []
    if cfg.peers:
        more, notes = peer_rows(cfg, code)
        rows += more
    add_ratios(rows)
    fixed = next(r for r in runs if r.concurrency == 1 and r.mode.startswith("spec k="))
    plain = next(r for r in runs if r.concurrency == 1 and r.mode == "target-only")
    alpha = fixed.per_position_acceptance(cfg.k) or 0.0
    bound = speedup_bound(bench.target, bench.draft, alpha, cfg.k)
    measured = fixed.tokens_per_s / plain.tokens_per_s
    report = {
        "config": {k: str(v) for k, v in asdict(cfg).items()},
        "rows": [asdict(r) for r in rows],
        "bound": {
            **asdict(bound),
            "cost_ratio": bound.cost_ratio,
            "speedup_bound": bound.speedup,
            "measured_speedup": measured,
            "efficiency": measured / bound.speedup,
        },
        "lossless": all(
            r.output_token_ids == plain.output_token_ids for r in runs if r.concurrency == 1
        ),
        "notes": notes,
    }
    (cfg.out_dir / "bench.json").write_text(json.dumps(report, indent=2))
    return report
