"""Print the bench report as a table and draw it as a PNG."""

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from specctl.console import make_console


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    console = console or make_console()
    console.print(f"[bold]target shape[/bold] {report.get('shape_description', '')}")
    device = report.get("config", {}).get("device", "cpu")
    console.print(f"[bold]device[/bold] {device}")
    temperature = report.get("temperature", 0.0)
    how = "greedy" if not temperature else f"sampled at T = {temperature:g}, seeded"
    table = Table(title=f"specctl bench ({how}, EOS ignored, same prompts for every engine)")
    for col in (
        "engine",
        "mode",
        "conc.",
        "prompts",
        "tokens/s",
        "x specctl target-only",
        "acceptance",
        "mean acc. len",
        "note",
    ):
        table.add_column(col, justify="left" if col in ("engine", "mode", "note") else "right")
    for r in report["rows"]:
        table.add_row(
            r["engine"],
            r["mode"],
            str(r["concurrency"]),
            r["prompts"],
            f"{r['tokens_per_s']:.1f}",
            _fmt(r["ratio"], ".2f"),
            _fmt(r["acceptance_rate"], ".3f"),
            _fmt(r["mean_acceptance_length"], ".2f"),
            r["note"],
        )
    console.print(table)
    b = report["bound"]
    if b is None:
        console.print("analytic bound at batch 1: not computed (concurrency 1 was not run)")
    else:
        _print_bound(b, console)
    lowest = report.get("lossless_concurrency", 1)
    if report["lossless"] is None:
        console.print(
            "sampled outputs are draws, not compared with target-only's (tests/engine/"
            "test_sampling_lossless.py checks their distribution)"
        )
    else:
        console.print(
            f"greedy outputs identical to target-only at concurrency {lowest}: {report['lossless']}"
        )
    _print_adaptive(report.get("adaptive", []), console)
    for batch, points in report.get("forward_curve", {}).items():
        curve = " ".join(f"{p['over_t1']:.2f}" for p in points)
        console.print(
            f"target pass of t tokens over 1 token, batch {batch}, t=1..9: {curve} "
            f"(t=1: {points[0]['ms']:.1f} ms)"
        )
    for note in report["notes"]:
        console.print(f"note: {note}")


def _print_bound(b: dict[str, Any], console: Console) -> None:
    console.print(
        f"analytic bound at batch 1: per-position acceptance a={b['acceptance']:.3f} "
        f"(fitted to the fixed-k run), k={b['k']}, "
        f"target step {1000 * b['target_step_s']:.2f} ms, "
        f"verify of k+1 tokens {1000 * b['verify_s']:.2f} ms, "
        f"draft step {1000 * b['draft_step_s']:.2f} ms (cost ratio {b['cost_ratio']:.1f}x): "
        f"expected speedup (1-a^(k+1))/(1-a) / round cost = {b['speedup_bound']:.2f}x; "
        f"measured {b['measured_speedup']:.2f}x; efficiency {b['efficiency']:.2f}"
    )
    if "end_to_end_bound" in b:
        console.print(
            f"  end to end (target-only's prefill as it ran, its decoding at the bound): "
            f"bound {b['end_to_end_bound']:.2f}x; efficiency {b['end_to_end_efficiency']:.2f}"
        )
    if "measured_decode_speedup" in b:
        console.print(
            f"  decoding alone (the runs' wall time less their prefill, "
            f"{100 * b['prefill_share']:.0f}% of the speculative run): measured "
            f"{b['measured_decode_speedup']:.2f}x; efficiency {b['decode_efficiency']:.2f}"
        )
    if b.get("chain_ceiling") is not None:
        console.print(
            f"  ceiling of any chain of this draft's greedy guesses (any k, drafts free, verify "
            f"as cheap as one step; counted on target-only's outputs): decoding "
            f"{b['chain_ceiling']:.2f}x, end to end {b['end_to_end_ceiling']:.2f}x"
        )


def _print_adaptive(summary: list[dict[str, Any]], console: Console) -> None:
    if not summary:
        return
    table = Table(title="adaptive k against the best fixed k (same run)")
    columns = ("prompts", "conc.", "best fixed", "tokens/s", "adaptive", "x best", "x target",
               "x best, paired", "x target, paired")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col in ("prompts", "best fixed") else "right")
    for a in summary:
        table.add_row(
            a["prompts"],
            str(a["concurrency"]),
            a["best_fixed"],
            f"{a['best_fixed_tokens_per_s']:.1f}",
            f"{a['adaptive_tokens_per_s']:.1f}",
            f"{a['adaptive_over_best_fixed']:.3f}",
            f"{a['adaptive_over_target_only']:.2f}",
            _ratio(a.get("adaptive_over_best_fixed_paired"), 3),
            _ratio(a.get("adaptive_over_target_only_paired"), 2),
        )
    console.print(table)
    console.print(
        "  x best, x target: ratios of the medians; paired: the median over repeats of the ratio"
        " within each repeat (the configurations' repeats run side by side: request by request"
        " at concurrency 1, step by step above)"
    )


def _ratio(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def plot_report(reports: list[dict[str, Any]], path: Path) -> Path | None:
    """Bars at batch 1 (every engine), lines for specctl under concurrency; None without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(len(reports), 2, figsize=(13, 5 * len(reports)), squeeze=False)
    for report, (left, right) in zip(reports, axes, strict=True):
        _plot_shape(report, left, right)
    fig.suptitle("specctl bench")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_shape(report: dict[str, Any], left: Any, right: Any) -> None:
    rows = [r for r in report["rows"] if r["prompts"] == "code"]
    single = [r for r in rows if r["concurrency"] == 1]
    left.barh([f"{r['engine']} {r['mode']}" for r in single], [r["tokens_per_s"] for r in single])
    left.set_xlabel("tokens/s (batch 1)")
    left.invert_yaxis()
    series = sorted({(r["engine"], r["mode"]) for r in rows if r["engine"] != "transformers"})
    for engine, mode in series:
        pts = sorted(
            (r["concurrency"], r["tokens_per_s"])
            for r in rows
            if (r["engine"], r["mode"]) == (engine, mode)
        )
        right.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{engine} {mode}")
    right.set_xscale("log", base=2)
    right.set_xlabel("concurrent requests")
    right.set_ylabel("tokens/s")
    right.legend()
    left.set_title(f"{report.get('shape', '')}: batch 1")
    right.set_title(f"{report.get('shape', '')}: under concurrency")
