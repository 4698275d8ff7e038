"""`specctl bench`: a thin CLI over bench/ (see bench/compare.py)."""

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import torch
from rich.console import Console

from bench.compare import BenchConfig, run_bench, write_report
from bench.report import plot_report, print_report
from specctl.console import make_console
from specctl.demo_pair import DEMO_PROMPTS_CODE, DEMO_PROMPTS_PROSE, REPO_ROOT, require_demo_pair


def resolve_target(target: Path | None, cost_ratio: float, out_dir: Path, console: Console) -> Path:
    """The given target, or the demo target deepened until one decode step costs about
    cost_ratio times the draft's, measured on this machine with specctl's own runner."""
    if target is not None:
        return target
    demo_target, demo_draft = require_demo_pair()
    if cost_ratio <= 0:
        return demo_target
    dst = out_dir / f"cost-scaled-target-x{cost_ratio:g}"
    if (dst / "config.json").is_file():
        return dst
    cost_scale = _load_cost_scale()
    draft_s = _step_seconds(demo_draft)
    base_layers = _num_layers(demo_target)
    per_layer_s = _step_seconds(demo_target) / base_layers
    extra = max(0, round(cost_ratio * draft_s / per_layer_s) - base_layers)
    console.print(
        f"building the cost-scaled target in {dst}: +{extra} zero-output layers "
        f"(draft step {1000 * draft_s:.2f} ms, {1000 * per_layer_s:.2f} ms per target layer)"
    )
    cost_scale.build_cost_scaled_target(demo_target, dst, extra_layers=extra)
    console.print(f"measured cost ratio: {_step_seconds(dst) / draft_s:.1f}x the draft")
    return dst


SHAPES = ("narrow", "wide")
WIDE_INTERMEDIATE = 16384


def resolve_targets(
    shape: str, target: Path | None, cost_ratio: float, out_dir: Path, console: Console
) -> dict[str, Path]:
    """Target dir per shape: the given one ("custom"), or the cost-scaled demo targets
    `shape` names ("narrow", "wide" or "both")."""
    if target is not None:
        return {"custom": target}
    shapes = SHAPES if shape == "both" else (shape,)
    targets: dict[str, Path] = {}
    for name in shapes:
        if name == "narrow":
            targets[name] = resolve_target(None, cost_ratio, out_dir, console)
        else:
            targets[name] = resolve_wide_target(out_dir, console)
    return targets


def resolve_wide_target(out_dir: Path, console: Console) -> Path:
    """The demo target with its MLPs widened to WIDE_INTERMEDIATE (built once, cached)."""
    demo_target, _ = require_demo_pair()
    dst = out_dir / f"wide-target-i{WIDE_INTERMEDIATE}"
    if not (dst / "config.json").is_file():
        console.print(f"building the wide target in {dst}: MLP width {WIDE_INTERMEDIATE}")
        _load_cost_scale().build_wide_target(demo_target, dst, WIDE_INTERMEDIATE)
    return dst


def _step_seconds(model_dir: Path) -> float:
    from bench.costs import forward_seconds
    from daemon.runtime.model import load_model

    return forward_seconds(load_model(model_dir, dtype="float32", num_slots=1), 1)


def _num_layers(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["num_hidden_layers"])


def _load_cost_scale() -> ModuleType:
    """packaging/ is not an importable package (its name is taken by PyPI's `packaging`)."""
    path = REPO_ROOT / "packaging" / "demo_models" / "cost_scale.py"
    spec = importlib.util.spec_from_file_location("specctl_cost_scale", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_bench_command(
    cfg: BenchConfig, target: Path | None, cost_ratio: float, shape: str = "both"
) -> None:
    console = make_console()
    if cfg.threads:  # before the cost calibration, so that it measures what the bench runs
        torch.set_num_threads(cfg.threads)
    targets = resolve_targets(shape, target, cost_ratio, cfg.out_dir, console)
    reports = []
    for name, path in targets.items():
        cfg.target, cfg.shape = path, name
        console.print(f"[bold]{name}[/bold] target {cfg.target}\ndraft  {cfg.draft}")
        report = run_bench(cfg)
        print_report(report, console)
        reports.append(report)
        write_report(cfg.out_dir, reports, cfg.threads)  # after each shape: a crash keeps it
    path = write_report(cfg.out_dir, reports, cfg.threads)
    png = plot_report(reports, cfg.out_dir / "bench.png")
    console.print(f"wrote {path}" + (f" and {png}" if png else " (no plot: matplotlib missing)"))


def default_config(out_dir: Path, draft: Path | None) -> BenchConfig:
    _, demo_draft = require_demo_pair() if draft is None else (None, draft)
    assert demo_draft is not None
    return BenchConfig(
        target=Path(),
        draft=demo_draft,
        code_prompts=DEMO_PROMPTS_CODE,
        prose_prompts=DEMO_PROMPTS_PROSE,
        out_dir=out_dir,
    )
