"""The native pass against the module path: one forward pass's time, side by side.

    python -m bench.native_pass_bench [--models DIR,DIR] [--tokens 1,5] [--batch 1] [--threads 1]

Each model is loaded twice, once with the native pass (model/native_pass.py) and once without
(the module path, as with SPECCTL_NATIVE_PASS=0), and every (model, path, tokens) pass is timed
round robin (bench/costs.py `pass_seconds`: the repeats interleaved, so a slow spell of the
machine costs both paths alike): a pass appending `--tokens` tokens per sequence after 128
cached ones, logits of every position, at `--batch` sequences. The default models are the demo
pair; `specctl bench` builds the cost-scaled targets (`.bench-out/narrow-target-x30`,
`.bench-out/wide-target-i16384`), which `--models` takes too. Both paths give the same bits
(tests/model/test_native_pass.py); this measures what the module path's Python costs.
"""

import argparse
import os
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from bench.arg_types import positive_int, positive_int_list
from bench.costs import pass_seconds
from daemon.runtime.errors import ModelLoadError
from daemon.runtime.model import load_model
from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.runtime.model.native_pass import DISABLE_ENV
from daemon.runtime.model.protocol import CausalLM
from specctl.demo_pair import require_demo_pair


def _load(model_dir: Path, batch: int, native: bool) -> CausalLM:
    """The model in float32, with or without the native pass (the switch read at load)."""
    before = os.environ.get(DISABLE_ENV)
    os.environ[DISABLE_ENV] = "1" if native else "0"
    try:
        return load_model(model_dir, dtype="float32", num_slots=batch)
    finally:
        if before is None:
            del os.environ[DISABLE_ENV]
        else:
            os.environ[DISABLE_ENV] = before


def measure(
    model_dir: Path, tokens: list[int], batch: int, repeats: int
) -> list[tuple[int, float, float]]:
    """(tokens, native pass s, module path s) per token count; ModelLoadError where the model
    does not take the native pass here (no kernels, another CPU, a layer they do not run)."""
    native, modules = _load(model_dir, batch, True), _load(model_dir, batch, False)
    if not isinstance(native, LlamaForCausalLM) or native.native_pass is None:
        raise ModelLoadError(f"{model_dir}: the native pass does not run this model here")
    passes = [(model, t) for t in tokens for model in (native, modules)]
    seconds = pass_seconds(passes, batch=batch, repeats=repeats)
    return [(t, seconds[2 * i], seconds[2 * i + 1]) for i, t in enumerate(tokens)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="Comma-separated dirs (default: demo pair).")
    parser.add_argument("--tokens", type=positive_int_list, default=[1, 5], help="Comma-separated.")
    parser.add_argument("--batch", type=positive_int, default=1)
    parser.add_argument("--repeats", type=positive_int, default=20)
    parser.add_argument("--threads", type=positive_int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.models:
        models = [Path(part) for part in args.models.split(",") if part]
    else:
        target, draft = require_demo_pair()
        models = [draft, target]
    for path in models:
        if not (path / "config.json").is_file():
            parser.error(f"--models: {path} holds no config.json")
    table = Table(title=f"one pass, batch {args.batch}, {args.threads} thread(s), 128 cached")
    table.add_column("model", overflow="fold")  # a long path wraps, never cut short
    for column in ("tokens", "native pass ms", "module path ms", "module / native"):
        table.add_column(column, justify="right")
    for path in models:
        try:
            rows = measure(path, args.tokens, args.batch, args.repeats)
        except ModelLoadError as exc:
            parser.error(str(exc))
        for tokens, native_s, module_s in rows:
            table.add_row(
                "/".join(path.parts[-2:]),  # e.g. demo-models/draft
                str(tokens),
                f"{native_s * 1e3:.3f}",
                f"{module_s * 1e3:.3f}",
                f"{module_s / native_s:.2f}",
            )
    Console().print(table)


if __name__ == "__main__":
    main()
