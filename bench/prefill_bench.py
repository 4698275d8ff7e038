"""Prefill time of one prompt against its length, on the lean runner.

    python -m bench.prefill_bench [--target DIR] [--lengths 147,1000,2000] [--threads 1]

Attention in a prefill grows as T^2 while the rest grows as T, so long prompts show what the
attention path costs (its mask, its kernel) where the bench's ~150-token prompts do not. The
default target is the demo target (float32); `specctl bench` builds the cost-scaled ones
(`.bench-out/narrow-target-x30`, `.bench-out/wide-target-i16384`). Random token ids; the
median of `--repeats` passes after one warm-up pass, each into a freed slot.
"""

import argparse
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from bench.arg_types import positive_int, positive_int_list
from daemon.runtime.errors import ModelLoadError
from daemon.runtime.model import ForwardBatch, LogitsMode, load_model
from specctl.demo_pair import require_demo_pair


def prefill_seconds(model_dir: Path, lengths: list[int], repeats: int) -> list[float]:
    """Median seconds of a LAST-mode pass over a prompt of each length, batch 1."""
    model = load_model(model_dir, dtype="float32", num_slots=1, max_model_len=max(lengths))
    generator = torch.Generator().manual_seed(0)
    medians = []
    with torch.inference_mode():
        for length in lengths:
            tokens = torch.randint(0, model.vocab_size, (length,), generator=generator).tolist()
            times = []
            for _ in range(repeats + 1):
                model.free_slot(0)
                start = time.perf_counter()
                model.forward(ForwardBatch([0], [tokens], [0], LogitsMode.LAST))
                times.append(time.perf_counter() - start)
            measured = sorted(times[1:])
            medians.append(measured[len(measured) // 2])
    return medians


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=None, help="Model dir (default: demo).")
    parser.add_argument(
        "--lengths", type=positive_int_list, default=[147, 1000, 2000], help="Comma-separated."
    )
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--threads", type=positive_int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = args.target or require_demo_pair()[0]
    lengths: list[int] = args.lengths
    table = Table(title=f"prefill, batch 1, {args.threads} thread(s): {target}")
    table.add_column("prompt tokens", justify="right")
    table.add_column("ms", justify="right")
    table.add_column("ms per token", justify="right")
    try:
        seconds_per_length = prefill_seconds(target, lengths, args.repeats)
    except ModelLoadError as exc:
        parser.error(str(exc))
    for length, seconds in zip(lengths, seconds_per_length, strict=True):
        table.add_row(str(length), f"{seconds * 1e3:.0f}", f"{seconds * 1e3 / length:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
