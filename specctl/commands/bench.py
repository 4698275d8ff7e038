"""`specctl bench`: a thin CLI over bench/ (see bench/compare.py)."""

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

import torch
from rich.console import Console

from bench.compare import BenchConfig, run_bench, write_report
from bench.machine import describe_machine, machine_line
from bench.report import plot_report, print_report
from specctl.console import make_console
from specctl.demo_pair import DEMO_PROMPTS_CODE, DEMO_PROMPTS_PROSE, REPO_ROOT, require_demo_pair

DRAFT_STEPS = 4  # the draft steps in a row after each target step the calibration times
CALIBRATION_TOLERANCE = 0.15  # a built target off its ratio by more is rebuilt once


def resolve_target(target: Path | None, cost_ratio: float, out_dir: Path, console: Console) -> Path:
    """The given target, or the demo target deepened until one decode step costs about
    cost_ratio times a draft step, measured on this machine with specctl's own runner the way
    the engine runs them: DRAFT_STEPS draft steps in a row after each target step (the first
    of which finds the draft's weights evicted by the target's: bench/costs.py)."""
    if target is not None:
        return target
    demo_target, demo_draft = require_demo_pair()
    if cost_ratio <= 0:
        return demo_target
    dst = out_dir / f"narrow-target-x{cost_ratio:g}"
    if (dst / "config.json").is_file():
        return dst
    cost_scale = _load_cost_scale()
    base_layers = _num_layers(demo_target)
    target_s, draft_s = _step_seconds(demo_target, demo_draft)
    extra = max(0, round(cost_ratio * draft_s * base_layers / target_s) - base_layers)
    console.print(
        f"building the narrow target in {dst}: +{extra} zero-output layers (draft step "
        f"{1000 * draft_s:.2f} ms, {1000 * target_s / base_layers:.2f} ms per target layer)"
    )
    cost_scale.build_cost_scaled_target(demo_target, dst, extra_layers=extra)
    target_s, draft_s = _step_seconds(dst, demo_draft)
    if abs(target_s / draft_s / cost_ratio - 1) > CALIBRATION_TOLERANCE:
        # a deeper target evicts more of the draft from the cache than the demo target did
        layers = base_layers + extra
        extra = max(0, round(layers * cost_ratio * draft_s / target_s) - base_layers)
        console.print(
            f"measured {target_s / draft_s:.1f}x the draft step; rebuilding with +{extra} layers"
        )
        shutil.rmtree(dst)
        cost_scale.build_cost_scaled_target(demo_target, dst, extra_layers=extra)
        target_s, draft_s = _step_seconds(dst, demo_draft)
    console.print(f"measured cost ratio: {target_s / draft_s:.1f}x the draft step")
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


def _step_seconds(target_dir: Path, draft_dir: Path) -> tuple[float, float]:
    """(a target step, a draft step among DRAFT_STEPS after it), seconds, measured round robin."""
    from bench.costs import pass_seconds
    from daemon.runtime.model import load_model

    target = load_model(target_dir, dtype="float32", num_slots=1)
    draft = load_model(draft_dir, dtype="float32", num_slots=1)
    target_s, draft_s = pass_seconds([(target, 1), (draft, 1, DRAFT_STEPS)], repeats=100)
    return target_s, draft_s


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
    console.print(f"[bold]machine[/bold] {machine_line(describe_machine(cfg.threads))}")
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
