"""The CPU matmuls a pass can use, side by side: rows against time, weights streamed from memory.

    python -m bench.linear_bench [--rows 1,2,5,9,16,64,144] [--layers 6] [--threads 1]

One "layer" is the wide bench target's MLP (gate+up [2 x 16384, 256] then down [256, 16384],
float32, 50 MB), and `--layers` copies of it are multiplied in turn, so the weights come from
memory as in a pass of a model past the last-level cache (6 layers: 302 MB, the wide target's
MLPs). Each backend computes silu(gate) * up between the two products, as the runner does:
MKL (`F.linear` on the dense weight), oneDNN (weights reordered once, rows padded to 4 below
4 as linear.py does), and the skinny GEMM (panels; the gate and up projections in its gated
form). The backends run interleaved, repeat after repeat, so a slow moment of a shared machine
hits them alike; the median of the repeats is reported, with the time one read of the weights
takes (a sum over them) as the floor.
"""

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from daemon.runtime.model import skinny

HIDDEN, INTERMEDIATE = 256, 16384
Step = Callable[[torch.Tensor], None]


def _mkl(gate_up: list[torch.Tensor], down: list[torch.Tensor]) -> Step:
    def step(x: torch.Tensor) -> None:
        for gu, dn in zip(gate_up, down, strict=True):
            gate, up = F.linear(x, gu).split(INTERMEDIATE, dim=-1)
            F.linear(F.silu(gate) * up, dn)

    return step


def _onednn(gate_up: list[torch.Tensor], down: list[torch.Tensor]) -> Step:
    mkldnn = torch.ops.mkldnn
    packed = [
        (mkldnn._reorder_linear_weight(gu, 8), mkldnn._reorder_linear_weight(dn, 8))
        for gu, dn in zip(gate_up, down, strict=True)
    ]

    def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return mkldnn._linear_pointwise(x, weight, None, "none", [], "")

    def step(x: torch.Tensor) -> None:
        rows = x.shape[0]
        if rows < 4:  # oneDNN's 1-3 row kernel is slower than its 4-row one (linear.py)
            x = torch.cat([x, x.new_zeros(4 - rows, x.shape[1])])
        for gu, dn in packed:
            gate, up = linear(x, gu).split(INTERMEDIATE, dim=-1)
            linear(F.silu(gate) * up, dn)

    return step


def _skinny(gate_up: list[torch.Tensor], down: list[torch.Tensor]) -> Step:
    packed = [
        (skinny.pack_gated(gu), skinny.pack(dn)) for gu, dn in zip(gate_up, down, strict=True)
    ]

    def step(x: torch.Tensor) -> None:
        for gu, dn in packed:
            skinny.linear(skinny.gated_linear(x, gu, INTERMEDIATE), dn, HIDDEN)

    return step


def _read_ms(weights: list[torch.Tensor], repeats: int = 5) -> float:
    """The median time of one pass reading every weight (a sum over each): the floor."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for w in weights:
            w.sum()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,2,3,4,5,6,7,8,9,12,16,32,64,144")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows: not a comma-separated list of integers: {args.rows!r}")
    if args.layers < 1 or args.threads < 1 or args.repeats < 1 or min(rows) < 1:
        parser.error("--rows, --layers, --threads and --repeats must be positive")
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    gate_up = [torch.randn(2 * INTERMEDIATE, HIDDEN, generator=gen) for _ in range(args.layers)]
    down = [torch.randn(HIDDEN, INTERMEDIATE, generator=gen) for _ in range(args.layers)]
    backends: dict[str, Step] = {"mkl": _mkl(gate_up, down), "onednn": _onednn(gate_up, down)}
    if skinny.available():
        backends["skinny"] = _skinny(gate_up, down)
    mb = sum(w.numel() * 4 for w in [*gate_up, *down]) / 1e6
    print(f"{args.layers} MLP layers, {mb:.0f} MB float32, {args.threads} thread(s); ms per pass")
    header = "rows " + " ".join(f"{name:>14}" for name in backends)
    print(f"{header}  (one read of the weights: {_read_ms([*gate_up, *down]):.1f} ms)")
    with torch.inference_mode():
        for num_rows in rows:
            x = torch.randn(num_rows, HIDDEN, generator=gen)
            times: dict[str, list[float]] = {name: [] for name in backends}
            for step in backends.values():
                step(x)  # warm
            for _ in range(args.repeats):
                for name, step in backends.items():
                    start = time.perf_counter()
                    step(x)
                    times[name].append(time.perf_counter() - start)
            base = statistics.median(times["onednn"])
            cells = [
                f"{1000 * statistics.median(t):7.1f} ({statistics.median(t) / base:4.2f})"
                for t in times.values()
            ]
            print(f"{num_rows:4d} " + " ".join(f"{c:>14}" for c in cells))
    print("(in brackets: over oneDNN at the same rows)")


if __name__ == "__main__":
    main()
