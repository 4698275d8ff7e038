"""The cost of tensor parallelism's coordination, measured on the same model in one run.

    python -m bench.tensor_parallel [--model DIR] [--steps 60] [--sizes 1,2]

Per size, the lean runner's forward at batch 1 (one decode token) and batch 8 x 5 tokens (a
verify round at k = 4), one torch thread per rank, ranks as processes joined by gloo on this
machine, rank 0 leading (each call broadcast to the others, two all-reduces per layer). On a
CPU with fewer cores than ranks the ranks share cores, so the figure here is the coordination
overhead, not a speed-up: the command broadcast and the all-reduces per call. Prints ms per
call per size and the ratio to size 1.
"""

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

import torch

from daemon.runtime.model.batch import ForwardBatch, LogitsMode
from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.runtime.model.loader import load_model
from daemon.runtime.parallel.follower import follow
from daemon.runtime.parallel.group import TensorParallel, init_group, pick_address
from daemon.runtime.parallel.leader import TensorParallelLM
from specctl.demo_pair import demo_pair_dirs

SHAPES = {"decode b1": (1, 1), "verify b8 x5": (8, 5)}
PROMPT_LEN = 64


def _timed(model: object, steps: int) -> dict[str, float]:
    out = {}
    for name, (batch, tokens) in SHAPES.items():
        slots = list(range(batch))
        prefill = ForwardBatch(slots, [[7] * PROMPT_LEN] * batch, [0] * batch, LogitsMode.NONE)
        model.forward(prefill)  # type: ignore[attr-defined]
        step = ForwardBatch(slots, [[11] * tokens] * batch, [PROMPT_LEN] * batch, LogitsMode.ALL)
        for _ in range(3):
            model.forward(step)  # type: ignore[attr-defined]
        start = time.perf_counter()
        for _ in range(steps):
            model.forward(step)  # type: ignore[attr-defined]
        out[name] = (time.perf_counter() - start) / steps * 1e3
    return out


def _rank(model_dir: str, rank: int, size: int, address: str, steps: int, q: "mp.Queue") -> None:
    torch.set_num_threads(1)
    tp = init_group(rank, size, address, timeout_s=120) if size > 1 else TensorParallel(0, 1)
    model = load_model(model_dir, dtype="float32", num_slots=8, tp=tp)
    assert isinstance(model, LlamaForCausalLM)
    if rank > 0:
        follow(model)
        return
    leader = TensorParallelLM(model) if size > 1 else model
    try:
        q.put(_timed(leader, steps))
    finally:
        if isinstance(leader, TensorParallelLM):
            leader.close()


def measure(model_dir: Path, size: int, steps: int) -> dict[str, float]:
    context = mp.get_context("spawn")
    q = context.Queue()
    address = pick_address()
    procs = [
        context.Process(target=_rank, args=(str(model_dir), r, size, address, steps, q))
        for r in range(size)
    ]
    for p in procs:
        p.start()
    try:
        return q.get(timeout=600)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=demo_pair_dirs()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--sizes", default="1,2")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {size: measure(args.model, size, args.steps) for size in sizes}
    if args.json:
        print(json.dumps({str(k): v for k, v in results.items()}))
        return
    base = results[sizes[0]]
    print(f"model {args.model}, {args.steps} calls per shape, 1 torch thread per rank")
    print(f"{'TP':>3} " + " ".join(f"{name:>22}" for name in SHAPES))
    for size, row in results.items():
        cells = [f"{row[n]:8.2f} ms ({row[n] / base[n]:4.2f}x)" for n in SHAPES]
        print(f"{size:>3} " + " ".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
