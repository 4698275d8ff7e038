"""A pipeline-parallel verifier against the whole verifier on one node, in one run.

    python -m bench.pipeline_bench [--split 4] [--batch 1,8] [--delay-us 2000]

A local three-node Ray cluster with token auth: `verifier-node` (the verifier's process, the
first stage), `stage-node` (the later stage) and `stage-far` (the same, its actor calls delayed
by Ray's testing hook to emulate a slower link). Per batch size: the whole demo target on
`verifier-node`; the target split at layer `--split` (first stage there, the rest on
`stage-node`); the same split with the later stage on `stage-far`. Each runs target-only and
with the draft model colocated in the verifier's process (k = 4), greedy, EOS ignored, one
torch thread per shard. Prints tokens/s, the ratio to the whole verifier, and whether the
outputs are identical. On this machine every node shares the same 2 cores, so the figure is
the pipeline's own cost (one actor call and a hidden-state transfer per model call), not the
memory it frees, which is why a user splits a verifier.
"""

import argparse
import tempfile
import time
from pathlib import Path

from bench.split_bench import LOAD_TIMEOUT_S, _generate, _Sink, _workload
from daemon.cluster_token import generate_token, write_token
from daemon.shard.specs import StageSpec, VerifierSpec
from specctl.cluster.local_cluster import LocalCluster
from specctl.cluster.local_nodes import LocalNodeSpec
from specctl.demo_pair import require_demo_pair
from specctl.deploy.actors import Placement, create_stage, create_verifier, kill_actor
from specctl.deploy.ray_connect import connect, disconnect
from specctl.deploy.remote_backend import RemoteBackend, served_model

VERIFIER_NODE, STAGE_NODE, FAR_NODE = "verifier-node", "stage-node", "stage-far"
SHAPES = {"whole": None, "pipeline": STAGE_NODE, "pipeline, slow link": FAR_NODE}


def run(
    shape: str, speculative: bool, batch: int, split: int, prompts: list[list[int]], max_tokens: int
) -> tuple[float, list[list[int]]]:
    target, draft = require_demo_pair()
    name = f"pb-{abs(hash((shape, speculative, batch))) % 10**6}"
    stage_node = SHAPES[shape]
    stages = []
    if stage_node is not None:
        stage = StageSpec(str(target), (split, 6), num_slots=batch, dtype="float32", num_threads=1)
        create_stage(f"{name}.stage1", stage, Placement(stage_node))
        stages = [f"{name}.stage1"]
    spec = VerifierSpec(
        target_dir=str(target), dtype="float32", max_batch_size=batch,
        num_speculative_tokens=4 if speculative else 0,
        proposer="draft_model" if speculative else "none",
        draft_dir=str(draft) if speculative else None, num_threads=1,
        layers=(0, split) if stages else None, pipeline_stages=stages,
    )  # fmt: skip
    handle = create_verifier(f"{name}.verifier", spec, Placement(VERIFIER_NODE))
    backend = None
    try:
        model = served_model(handle, "bench", timeout_s=LOAD_TIMEOUT_S)
        backend = RemoteBackend(handle, model, actor_name=f"{name}.verifier")
        sink = _Sink()
        backend.start(sink)
        _generate(backend, sink, prompts[:batch], 16, "warm", batch)
        outputs, wall_s = _generate(backend, sink, prompts, max_tokens, "run", batch)
        return sum(len(o) for o in outputs) / wall_s, outputs
    finally:
        if backend is not None:
            backend.stop()
        for actor in (f"{name}.verifier", *stages):
            kill_actor(actor)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", type=int, default=4, help="layers on the first stage (of 6)")
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--delay-us", type=int, default=2000)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    target, _ = require_demo_pair()
    from daemon.runtime.engine.builder import load_tokenizer

    prompts = _workload(load_tokenizer(target), args.num_prompts)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pb-", dir="/tmp") as root:
        token_file = Path(root) / "cluster.token"
        write_token(token_file, generate_token(), force=False)
        cluster = LocalCluster(
            [
                LocalNodeSpec(VERIFIER_NODE),
                LocalNodeSpec(STAGE_NODE),
                LocalNodeSpec(FAR_NODE, actor_call_delay_us=args.delay_us),
            ],
            Path(root) / "ray",
            token_file,
        )
        start = time.monotonic()
        try:
            connect(cluster.start(), token_file)
            for batch in (int(b) for b in args.batch.split(",")):
                for speculative in (False, True):
                    for shape in SHAPES:
                        print(f"  batch {batch} {shape} speculative={speculative} ...", flush=True)
                        rate, outputs = run(
                            shape, speculative, batch, args.split, prompts, args.max_tokens
                        )
                        rows.append((batch, speculative, shape, rate, outputs))
        finally:
            disconnect()
            cluster.stop()
    print(f"\nsplit {args.split}:{6 - args.split}, link delay {args.delay_us} us on {FAR_NODE}, "
          f"{time.monotonic() - start:.0f} s")  # fmt: skip
    print(f"{'batch':>5} {'decoding':<12} {'shape':<20} {'tok/s':>8} {'vs whole':>9}")
    for batch, speculative, shape, rate, _ in rows:
        whole = next(r for r in rows if r[:2] == (batch, speculative) and r[2] == "whole")[3]
        kind = "speculative" if speculative else "target-only"
        print(f"{batch:>5} {kind:<12} {shape:<20} {rate:8.1f} {rate / whole:8.2f}x")
    same = all(r[4] == rows[0][4] for r in rows)
    print(f"outputs identical across shapes and modes: {same}")


if __name__ == "__main__":
    main()
