"""Drafter and verifier on different Ray nodes, against the colocated engine, in one run.

    python -m bench.split_bench [--batch 1,8] [--pairs plain,scaled] [--delay-us 2000]

A local three-node Ray cluster with token auth: `verifier-node`, `drafter-node`, and
`drafter-far`, whose actor calls are delayed by Ray's testing hook (RAY_testing_asio_delay_us
on PushTask, `--delay-us` each way) to emulate a slower link. Per pair (the plain demo pair; the
cost-scaled demo target `specctl bench` builds, ~1/25 of a step for the draft) and batch size,
each mode runs as real shard actors driven through `RemoteBackend`, as the serving process
drives them: colocated sync (the draft model inside the verifier's process), split sync,
split overlapped, and both split modes with the drafter on `drafter-far`. Each mode is warmed
on the same workload first, then measured: greedy, EOS ignored, k fixed, one torch thread per
shard; the outputs must be identical across modes.

Per mode: tokens/s and the ratio to colocated sync; per round: verify time V, the verifier's
time blocked on the drafter W, the drafter's own draft time D (per fresh call), the network
and serialisation time R = W/fresh call − D, the hit rate h of prepared proposals, bytes per
round per sequence, and the analytic bound V + (1 − h)(D + R) beside the measured round time
(and the bound plus the engine's own per-round work O, which the analytic bound leaves out).
Figures taken while other work shares the CPU are noisy: say so when quoting them.
"""

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from daemon.cluster_token import generate_token, write_token
from daemon.runtime.engine.request import Request
from daemon.runtime.sampling.params import SamplingParams
from daemon.shard.specs import DrafterSpec, VerifierSpec
from specctl.cluster.local_cluster import LocalCluster
from specctl.cluster.local_nodes import LocalNodeSpec
from specctl.demo_pair import DEMO_PROMPTS_CODE, require_demo_pair
from specctl.deploy.actors import Placement, create_drafter, create_verifier, kill_actor
from specctl.deploy.ray_connect import connect, disconnect
from specctl.deploy.remote_backend import RemoteBackend, served_model

VERIFIER_NODE, DRAFTER_NODE, FAR_NODE = "verifier-node", "drafter-node", "drafter-far"
LOAD_TIMEOUT_S = 300.0
FINISH_TIMEOUT_S = 600.0
MODES = ("colocated sync", "split sync", "split overlapped", "far sync", "far overlapped")


@dataclass(slots=True)
class ModeRow:
    pair: str
    batch: int
    mode: str
    tokens_per_s: float
    round_ms: float  # measured: engine step time per round, prefill excluded
    verify_ms: float  # V
    wait_ms: float  # W: blocked on the drafter (or drafting, colocated) per round
    draft_ms: float  # D: the drafter's own time per fresh call (colocated: per round)
    net_ms: float  # R: per fresh call, W's part that is not drafting
    overhead_ms: float  # O: the engine's own work per round
    hit_rate: float  # h
    fresh_share: float  # rounds that made a fresh (round-trip) call
    bytes_per_seq_round: float
    acceptance_rate: float
    bound_ms: float  # V + (1 - h)(D + R)
    bound_with_overhead_ms: float
    outputs: list[list[int]]


def _workload(tokenizer: Any, num_prompts: int) -> list[list[int]]:
    lines = [line for line in DEMO_PROMPTS_CODE.read_text().splitlines() if line.strip()]
    return [tokenizer.encode(json.loads(line)["prompt"]) for line in lines[:num_prompts]]


class _Sink:
    """Collects a backend's outputs and says when given requests have finished."""

    def __init__(self) -> None:
        import threading

        self._cond = threading.Condition()
        self.tokens: dict[str, list[int]] = {}
        self.finished: set[str] = set()

    def __call__(self, output: Any) -> None:
        with self._cond:
            for delta in output.deltas:
                self.tokens.setdefault(delta.request_id, []).extend(delta.new_token_ids)
                if delta.finished:
                    self.finished.add(delta.request_id)
            self._cond.notify_all()

    def wait(self, ids: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not set(ids) <= self.finished:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"requests not finished within {timeout_s:g} s")
                self._cond.wait(left)


def _generate(
    backend: RemoteBackend,
    sink: _Sink,
    prompts: list[list[int]],
    max_tokens: int,
    tag: str,
    batch: int,
) -> tuple[list[list[int]], float]:
    """All prompts through the backend, `batch` in flight at a time; (outputs, wall s)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    start = time.perf_counter()
    for first in range(0, len(ids), batch):
        wave = ids[first : first + batch]
        for rid in wave:
            backend.submit(Request(rid, prompts[ids.index(rid)], params))
        sink.wait(wave, FINISH_TIMEOUT_S)
    wall_s = time.perf_counter() - start
    return [sink.tokens[rid] for rid in ids], wall_s


def _specs(mode: str, target: Path, draft: Path, name: str, k: int, batch: int):
    colocated = mode.startswith("colocated")
    verifier = VerifierSpec(
        target_dir=str(target),
        dtype="float32",
        max_batch_size=batch,
        num_speculative_tokens=k,
        proposer="draft_model" if colocated else "remote",
        draft_dir=str(draft) if colocated else None,
        drafter_actor=None if colocated else f"{name}.drafter",
        mode="overlapped" if mode.endswith("overlapped") else "sync",
        num_threads=1,
    )
    drafter = (
        None
        if colocated
        else DrafterSpec(draft_dir=str(draft), dtype="float32", max_batch_size=batch, num_threads=1)
    )
    node = FAR_NODE if mode.startswith("far") else DRAFTER_NODE
    return verifier, drafter, node


def run_mode(
    pair: str,
    target: Path,
    draft: Path,
    mode: str,
    batch: int,
    prompts: list[list[int]],
    max_tokens: int,
    k: int,
) -> ModeRow:
    import ray

    name = f"bench-{pair}-{batch}-{mode.replace(' ', '-')}"
    verifier_spec, drafter_spec, drafter_node = _specs(mode, target, draft, name, k, batch)
    if drafter_spec is not None:
        create_drafter(f"{name}.drafter", drafter_spec, Placement(drafter_node))
    handle = create_verifier(f"{name}.verifier", verifier_spec, Placement(VERIFIER_NODE))
    backend: RemoteBackend | None = None
    try:
        model = served_model(handle, "bench", timeout_s=LOAD_TIMEOUT_S)
        backend = RemoteBackend(handle, model, actor_name=f"{name}.verifier")
        sink = _Sink()
        backend.start(sink)
        _generate(backend, sink, prompts, max_tokens, "warm", batch)
        ray.get(handle.speculation_stats.remote(True), timeout=60)
        outputs, wall_s = _generate(backend, sink, prompts, max_tokens, "run", batch)
        stats = ray.get(handle.speculation_stats.remote(False), timeout=60)
    finally:
        if backend is not None:
            backend.stop()
        kill_actor(f"{name}.verifier")
        kill_actor(f"{name}.drafter")
    return _row(pair, batch, mode, stats, outputs, wall_s)


def _row(pair: str, batch: int, mode: str, stats: dict, outputs: list, wall_s: float) -> ModeRow:
    engine, remote = stats["engine"], stats.get("remote")
    rounds = max(engine["num_rounds"], 1)
    verify_s = engine["verify_time_s"] / rounds
    wait_s = engine["draft_time_s"] / rounds  # time in propose(): drafting or waiting for it
    overhead_s = max(
        0.0,
        (
            engine["step_time_s"]
            - engine["verify_time_s"]
            - engine["draft_time_s"]
            - engine["prefill_time_s"]
        )
        / rounds,
    )
    if remote is None:  # colocated: the draft runs in the round, no network
        draft_s, net_s, hit, fresh_share = wait_s, 0.0, 0.0, 1.0
        bytes_per = 0.0
    else:
        seq_rounds = max(remote["num_seq_rounds"], 1)
        fresh_share = remote["num_fresh"] / seq_rounds
        fresh_calls = max(remote["num_fresh"] / batch, 1e-9)
        draft_s = remote["drafter_draft_s"] / fresh_calls
        net_s = max(0.0, remote["wait_s"] / fresh_calls - draft_s)
        with_branches = remote["num_with_branches"]
        hit = remote["num_hits"] / with_branches if with_branches else 0.0
        bytes_per = (remote["bytes_sent"] + remote["bytes_received"]) / seq_rounds
    num_tokens = sum(len(o) for o in outputs)
    bound_s = verify_s + (1 - hit) * (draft_s + net_s)
    drafted = max(engine["num_draft_tokens"], 1)
    return ModeRow(
        pair=pair,
        batch=batch,
        mode=mode,
        tokens_per_s=num_tokens / wall_s,
        round_ms=1000 * (engine["step_time_s"] - engine["prefill_time_s"]) / rounds,
        verify_ms=1000 * verify_s,
        wait_ms=1000 * wait_s,
        draft_ms=1000 * draft_s,
        net_ms=1000 * net_s,
        overhead_ms=1000 * overhead_s,
        hit_rate=hit,
        fresh_share=fresh_share,
        bytes_per_seq_round=bytes_per,
        acceptance_rate=engine["num_accepted_tokens"] / drafted,
        bound_ms=1000 * bound_s,
        bound_with_overhead_ms=1000 * (bound_s + overhead_s),
        outputs=outputs,
    )


def _print(rows: list[ModeRow]) -> None:
    header = (
        f"{'pair':7s} {'B':>2s} {'mode':17s} {'tok/s':>7s} {'x coloc':>7s} {'round':>6s} "
        f"{'V':>5s} {'W':>5s} {'D':>5s} {'R':>5s} {'O':>5s} {'h':>5s} {'B/seq':>6s} "
        f"{'acc':>5s} {'bound':>6s} {'+O':>6s}  (ms per round)"
    )
    print(header)
    for r in rows:
        base = next(
            x
            for x in rows
            if x.pair == r.pair and x.batch == r.batch and x.mode == "colocated sync"
        )
        print(
            f"{r.pair:7s} {r.batch:>2d} {r.mode:17s} {r.tokens_per_s:7.1f} "
            f"{r.tokens_per_s / base.tokens_per_s:7.2f} {r.round_ms:6.2f} {r.verify_ms:5.2f} "
            f"{r.wait_ms:5.2f} {r.draft_ms:5.2f} {r.net_ms:5.2f} {r.overhead_ms:5.2f} "
            f"{r.hit_rate:5.2f} {r.bytes_per_seq_round:6.0f} {r.acceptance_rate:5.2f} "
            f"{r.bound_ms:6.2f} {r.bound_with_overhead_ms:6.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--pairs", default="plain,scaled")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--delay-us", type=int, default=2000)
    parser.add_argument("--cost-ratio", type=float, default=25.0, help="the scaled pair's")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path(".bench-out"))
    args = parser.parse_args()
    target, draft = require_demo_pair()
    pairs = {"plain": target}
    if "scaled" in args.pairs.split(","):
        from specctl.commands.bench import resolve_target
        from specctl.console import make_console

        pairs["scaled"] = resolve_target(None, args.cost_ratio, args.out, make_console())
    pairs = {name: pairs[name] for name in args.pairs.split(",")}
    modes = args.modes.split(",")
    batches = [int(b) for b in args.batch.split(",")]
    from daemon.runtime.engine.builder import load_tokenizer

    prompts = _workload(load_tokenizer(target), args.num_prompts)
    with tempfile.TemporaryDirectory(prefix="sb-", dir="/tmp") as root:
        token_file = Path(root) / "cluster.token"
        write_token(token_file, generate_token(), force=False)
        cluster = LocalCluster(
            [
                LocalNodeSpec(VERIFIER_NODE),
                LocalNodeSpec(DRAFTER_NODE),
                LocalNodeSpec(FAR_NODE, actor_call_delay_us=args.delay_us),
            ],
            Path(root) / "ray",
            token_file,
        )
        rows: list[ModeRow] = []
        try:
            connect(cluster.start(), token_file)
            for pair, pair_target in pairs.items():
                for batch in batches:
                    for mode in modes:
                        print(f"  {pair} batch {batch} {mode} ...", flush=True)
                        rows.append(
                            run_mode(
                                pair,
                                pair_target,
                                draft,
                                mode,
                                batch,
                                prompts,
                                args.max_tokens,
                                args.k,
                            )
                        )
        finally:
            disconnect()
            leftover = cluster.stop()
    print()
    _print(rows)
    same = all(r.outputs == rows[0].outputs for r in rows)
    print(f"outputs identical across modes and pairs: {same}")
    print(f"Ray processes left: {leftover or 'none'}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "split_bench.json"
    out.write_text(
        json.dumps([{k: v for k, v in asdict(r).items() if k != "outputs"} for r in rows], indent=2)
    )
    print(f"written {out}")


if __name__ == "__main__":
    main()
