"""The CPU matmuls a pass can use, side by side: rows against time, weights streamed from memory.

    python -m bench.linear_bench [--rows 1,2,5,9,16,64,144] [--layers 6] [--threads 1]
    python -m bench.linear_bench --shape llama-3-8b --rows 1,2,3,4,5,6,7,9

By default one "layer" is the wide bench target's MLP (gate+up [2 x 16384, 256] then down
[256, 16384], float32, 50 MB), and `--layers` copies of it are multiplied in turn, so the
weights come from memory as in a pass of a model past the last-level cache (6 layers: 302 MB,
the wide target's MLPs). `--shape` takes a real model's decoder layer instead (its q/k/v and
output projections, then its MLP; one layer by default: Llama 3 8B's is 872 MB in float32),
where K runs from the hidden size to the intermediate one. Each backend computes
silu(gate) * up between the MLP's two products, as the runner does:
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
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from daemon.runtime.model import skinny

Step = Callable[[torch.Tensor], None]


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    intermediate: int
    qkv: int  # q, k and v projections' output width; 0: the MLP alone
    layers: int  # the default --layers


SHAPES = {
    "wide-mlp": LayerShape(256, 16384, 0, 6),
    "llama-3-8b": LayerShape(4096, 14336, 6144, 1),
    "qwen2.5-1.5b": LayerShape(1536, 8960, 2048, 3),
    "qwen2.5-0.5b": LayerShape(896, 4864, 1152, 6),
}


@dataclass
class Layer:
    """One layer's float32 weights, [out, in]; qkv and o None for an MLP alone."""

    qkv: torch.Tensor | None
    o: torch.Tensor | None
    gate_up: torch.Tensor  # [2 x intermediate, hidden]: the gate's rows, then the up's
    down: torch.Tensor

    def weights(self) -> list[torch.Tensor]:
        return [w for w in (self.qkv, self.o, self.gate_up, self.down) if w is not None]


def _layers(shape: LayerShape, count: int, gen: torch.Generator) -> list[Layer]:
    h, i = shape.hidden, shape.intermediate

    def w(out_f: int, in_f: int) -> torch.Tensor:
        return torch.randn(out_f, in_f, generator=gen) * in_f**-0.5

    return [
        Layer(
            w(shape.qkv, h) if shape.qkv else None,
            w(h, h) if shape.qkv else None,
            w(2 * i, h),
            w(h, i),
        )
        for _ in range(count)
    ]


def _chain(linear: Callable[[torch.Tensor, object], torch.Tensor], layers: list[tuple]) -> Step:
    """A pass: per layer, q/k/v and the output projection (of x: the same shapes as of the
    attention's output), then the MLP with silu(gate) * up between its products."""

    def step(x: torch.Tensor) -> None:
        for qkv, o, gate_up, down in layers:
            if qkv is not None:
                linear(x, qkv)
                x = linear(x, o)
            gate, up = linear(x, gate_up).chunk(2, dim=-1)
            linear(F.silu(gate) * up, down)

    return step


def _mkl(layers: list[Layer]) -> Step:
    return _chain(F.linear, [(w.qkv, w.o, w.gate_up, w.down) for w in layers])


def _onednn(layers: list[Layer]) -> Step:
    mkldnn = torch.ops.mkldnn

    def reorder(w: torch.Tensor | None) -> torch.Tensor | None:
        return None if w is None else mkldnn._reorder_linear_weight(w, 8)

    def linear(x: torch.Tensor, weight: object) -> torch.Tensor:
        rows = x.shape[0]
        if rows < 4:  # oneDNN's 1-3 row kernel is slower than its 4-row one (linear.py)
            x = torch.cat([x, x.new_zeros(4 - rows, x.shape[1])])
        return mkldnn._linear_pointwise(x, weight, None, "none", [], "")[:rows]

    return _chain(
        linear,
        [(reorder(w.qkv), reorder(w.o), reorder(w.gate_up), reorder(w.down)) for w in layers],
    )


def _skinny(layers: list[Layer]) -> Step:
    packed = [
        (
            None if w.qkv is None else skinny.pack(w.qkv),
            None if w.o is None else skinny.pack(w.o),
            skinny.pack_gated(w.gate_up),
            skinny.pack(w.down),
            0 if w.qkv is None else w.qkv.shape[0],
            w.down.shape[1],
        )
        for w in layers
    ]

    def step(x: torch.Tensor) -> None:
        for qkv, o, gate_up, down, qkv_width, inter in packed:
            if qkv is not None and o is not None:
                skinny.linear(x, qkv, qkv_width)
                x = skinny.linear(x, o, x.shape[1])
            skinny.linear(skinny.gated_linear(x, gate_up, inter), down, x.shape[1])

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
    parser.add_argument("--layers", type=int, default=None, help="default: the shape's")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="wide-mlp")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows: not a comma-separated list of integers: {args.rows!r}")
    shape = SHAPES[args.shape]
    num_layers = shape.layers if args.layers is None else args.layers
    if num_layers < 1 or args.threads < 1 or args.repeats < 1 or min(rows) < 1:
        parser.error("--rows, --layers, --threads and --repeats must be positive")
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    layers = _layers(shape, num_layers, gen)
    weights = [w for layer in layers for w in layer.weights()]
    backends: dict[str, Step] = {"mkl": _mkl(layers), "onednn": _onednn(layers)}
    if skinny.available():
        backends["skinny"] = _skinny(layers)
    mb = sum(w.numel() * 4 for w in weights) / 1e6
    what = "MLP layers" if not shape.qkv else "decoder layers' projections"
    print(
        f"{args.shape}: {num_layers} {what}, {mb:.0f} MB float32, "
        f"{args.threads} thread(s); ms per pass"
    )
    header = "rows " + " ".join(f"{name:>14}" for name in backends)
    print(f"{header}  (one read of the weights: {_read_ms(weights):.1f} ms)")
    with torch.inference_mode():
        for num_rows in rows:
            x = torch.randn(num_rows, shape.hidden, generator=gen)
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
