"""Text blocks of the Dashboard: the headline figures, acceptance by draft position, and GPU
use per node, each built from the store's rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.text import Text

from tui import formatting as fmt

if TYPE_CHECKING:
    from db import GpuSample, MetricSample

POSITION_BAR_CELLS = 16


def headline_figures(sample: MetricSample | None) -> Text:
    if sample is None:
        return Text("No metric samples yet: they appear once a deployment serves requests.", "dim")
    pairs = [
        ("accepted per round", fmt.number(sample.mean_acceptance_length, 2)),
        ("k in use", fmt.number(sample.k_in_use, 1)),
        ("batch", str(sample.batch_size)),
        ("running", str(sample.num_requests_running)),
        ("waiting", str(sample.num_requests_waiting)),
        (
            "TTFT p50/p99",
            f"{fmt.number(sample.ttft_p50_ms, 0)}/{fmt.number(sample.ttft_p99_ms, 0)} ms",
        ),
        (
            "TPOT p50/p99",
            f"{fmt.number(sample.tpot_p50_ms, 1)}/{fmt.number(sample.tpot_p99_ms, 1)} ms",
        ),
    ]
    text = Text()
    for index, (name, value) in enumerate(pairs):
        text.append(("  " if index else "") + f"{name} ", "dim")
        text.append(value, "bold")
    return text


def position_bars(acceptance: Sequence[float]) -> Text:
    """One row per draft position: how often a token drafted there was accepted."""
    text = Text("Acceptance by position\n", "bold")
    if not acceptance:
        return text.append("–", "dim")
    for position, rate in enumerate(acceptance, 1):
        text.append(f"{position:>2} ")
        text.append(fmt.bar(rate, POSITION_BAR_CELLS), "green")
        text.append(f" {fmt.percent(rate)}\n")
    return text


def gpu_use(samples: Sequence[GpuSample]) -> Text:
    """The newest reading of each GPU (gpu_index -1: a CPU node's memory), per node."""
    text = Text("GPU use per node\n", "bold")
    if not samples:
        return text.append("no GPU readings in the last 30 s", "dim")
    for sample in samples:
        device = "cpu" if sample.gpu_index < 0 else f"gpu{sample.gpu_index}"
        util = sample.utilization_percent
        text.append(f"{sample.node_name} {device} ")
        text.append(fmt.bar(None if util is None else util / 100, 6), "cyan")
        text.append(f" {fmt.MISSING if util is None else f'{util}%'}")
        text.append(f" {fmt.size(sample.memory_used_bytes)}")
        if sample.temperature_c is not None:
            text.append(f" {sample.temperature_c}°C")
        text.append("\n")
    return text
