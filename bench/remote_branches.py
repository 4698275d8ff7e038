"""Pre-drafted branches on the demo pair: how often a prepared branch is used, and what
preparing costs against a plain verify step.

    python -m bench.remote_branches --batch 1 8 --temperature 0 0.7 --branches 1 2 3 4 6
    python -m bench.remote_branches --transport process   # the drafter in a child process

Per batch size and temperature, side by side in one run: the engine with the draft in process
(colocated sync), with a RemoteProposer in sync mode, and in overlapped mode with a fixed
number of branches per sequence and with the adaptive budget. The remote modes go over a
ThreadTransport (the drafter on a thread: one interpreter, one GIL, which serialises both
sides' Python work, so its round times are no guide to split nodes) or a ProcessTransport (the
drafter in a child process: the two sides overlap for real, sharing this machine's cores).
It reports the hit rate h per sequence-round (by verdict kind), bytes per sequence-round,
tokens/s and the mean round time. Separately, single-threaded, it times one `prepare` per
branch budget against one verify pass of the target at the same batch size and one fresh
`propose`. Greedy outputs are checked against target-only decoding. Hit rates and bytes do
not depend on timing, except through the adaptive budget.
"""

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from bench.workload import load_prompt_texts, repeat_to
from daemon.runtime.engine.builder import load_tokenizer
from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.request import Request
from daemon.runtime.model import ForwardBatch, LogitsMode, load_model
from daemon.runtime.model.protocol import CausalLM
from daemon.runtime.proposers.base import Proposer, ProposeRequest
from daemon.runtime.proposers.draft_model import DraftModelProposer
from daemon.runtime.remote.builder import DraftServerSpec, build_draft_server
from daemon.runtime.remote.options import RemoteOptions
from daemon.runtime.remote.process_transport import ProcessTransport
from daemon.runtime.remote.remote_proposer import RemoteProposer
from daemon.runtime.remote.thread_transport import ThreadTransport
from daemon.runtime.sampling.params import SamplingParams
from specctl.demo_pair import DEMO_PROMPTS_CODE, require_demo_pair

K = 4


@dataclass(slots=True)
class RunRow:
    batch: int
    temperature: float
    mode: str  # "colocated" | "sync" | "overlapped <miss policy> <b=N | adaptive>"
    tokens_per_s: float
    round_ms: float
    acceptance_rate: float
    hit_rate: float | None = None
    hit_rate_by_kind: dict[str, float] = field(default_factory=dict)
    bytes_per_seq_round: float | None = None
    wait_ms_per_round: float | None = None
    mean_budget: float | None = None
    skip_rate: float | None = None  # sequence-rounds left without drafts after a miss
    is_lossless: bool | None = None  # greedy: identical to target-only


@dataclass(slots=True)
class CostRow:
    batch: int
    branches: int
    prepare_ms: float
    propose_ms: float
    verify_ms: float


def _generate(engine: SpecEngine, prompts: list[list[int]], params: SamplingParams) -> list:
    requests = [Request(f"r{i}", p, params) for i, p in enumerate(prompts)]
    return [o.token_ids for o in engine.generate(requests)]


def _run(
    target: CausalLM,
    proposer: Proposer | None,
    batch: int,
    prompts: list[list[int]],
    params: SamplingParams,
) -> tuple[SpecEngine, list[list[int]], float]:
    k = K if proposer is not None else 0
    engine = SpecEngine(
        target, proposer, EngineConfig(max_batch_size=batch, num_speculative_tokens=k)
    )
    start = time.perf_counter()
    outputs = _generate(engine, prompts, params)
    return engine, outputs, time.perf_counter() - start


def run_mode(
    target: CausalLM,
    draft_dir: str,
    batch: int,
    prompts: list[list[int]],
    params: SamplingParams,
    mode: str,
    reference: list[list[int]] | None,
    transport_kind: str = "thread",
    sparse_top_k: int = EngineConfig().draft_sparse_top_k,
) -> RunRow:
    transport = remote = None
    if mode == "colocated":
        proposer: Proposer = DraftModelProposer(
            load_model(draft_dir, dtype="float32", num_slots=batch), sparse_top_k=sparse_top_k
        )
    else:
        spec = DraftServerSpec(
            draft=draft_dir, num_slots=batch, dtype="float32", sparse_top_k=sparse_top_k
        )
        transport = (
            ThreadTransport(build_draft_server(spec))
            if transport_kind == "thread"
            else ProcessTransport(spec)
        )
        remote = RemoteProposer(transport, _options(mode))
        proposer = remote
    try:
        engine, outputs, wall_s = _run(target, proposer, batch, prompts, params)
        if remote is not None:
            remote.flush()
    finally:
        if transport is not None:
            transport.close()
    stats = engine.stats
    row = RunRow(
        batch=batch,
        temperature=params.temperature,
        mode=mode,
        tokens_per_s=stats.num_emitted_tokens / wall_s,
        round_ms=stats.step_time_s / max(stats.num_rounds, 1) * 1000,
        acceptance_rate=stats.acceptance_rate,
        is_lossless=None if reference is None else outputs == reference,
    )
    if remote is not None:
        rs = remote.stats
        row.hit_rate = rs.hit_rate if mode != "sync" else None
        row.hit_rate_by_kind = rs.hit_rate_by_kind()
        row.bytes_per_seq_round = rs.bytes_per_seq_round
        row.wait_ms_per_round = rs.wait_s / max(rs.num_rounds, 1) * 1000
        row.mean_budget = rs.mean_branch_budget if mode != "sync" else None
        row.skip_rate = rs.num_skipped / max(rs.num_seq_rounds, 1)
    return row


def _options(mode: str) -> RemoteOptions:
    """ "sync", or "overlapped <miss policy> <b=N | adaptive>"."""
    if mode == "sync":
        return RemoteOptions(mode="sync")
    _, policy, budget = mode.split()
    if budget == "adaptive":
        return RemoteOptions(miss_policy=policy)
    branches = int(budget.split("=")[1])
    return RemoteOptions(
        miss_policy=policy,
        max_branches=branches,
        initial_branches=branches,
        is_adaptive_branches=False,
    )


def _time_ms(fn: Callable[[], object], repeats: int = 10) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1000


def measure_costs(
    target: CausalLM, draft_dir: str, prompts: list[list[int]], branches: int
) -> CostRow:
    """One prepare (this many branches per sequence), one fresh propose and one verify pass,
    for len(prompts) sequences, all in this thread."""
    batch = len(prompts)
    draft = load_model(draft_dir, dtype="float32", num_slots=batch)
    proposer = DraftModelProposer(
        draft, max_branches=branches, min_branch_prob=0.0, is_branching=True
    )
    slots = list(range(batch))
    proposer.admit(slots, prompts)
    request = ProposeRequest(slots, prompts, [K] * batch, [SamplingParams()] * batch, [0] * batch)
    propose_ms = _time_ms(lambda: proposer.propose(request))
    prepare_ms = (
        _time_ms(lambda: (proposer.propose(request), proposer.prepare(request))) - propose_ms
    )
    target.forward(ForwardBatch(slots, prompts, [0] * batch, LogitsMode.NONE))
    verify = ForwardBatch(slots, [p[-1:] * (K + 1) for p in prompts], [len(p) - 1 for p in prompts])
    verify_ms = _time_ms(lambda: target.forward(verify))
    return CostRow(batch, branches, prepare_ms, propose_ms, verify_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.0, 0.7])
    parser.add_argument("--branches", type=int, nargs="+", default=[1, 2, 3, 4, 6])
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--transport", choices=["thread", "process"], default="thread")
    parser.add_argument(
        "--sparse-top-k", type=int, default=EngineConfig().draft_sparse_top_k,
        help="tokens a sampled draft's proposal lists (0: coupled drafting, the token alone)",
    )  # fmt: skip
    parser.add_argument(
        "--modes", nargs="+", default=None,
        help='run only these modes (e.g. "colocated" "overlapped fresh b=1"); default: all',
    )  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target_dir, draft_dir = require_demo_pair()
    tokenizer = load_tokenizer(target_dir)
    texts = load_prompt_texts(DEMO_PROMPTS_CODE)
    prompts = repeat_to([tokenizer.encode(t) for t in texts], args.num_prompts)
    fixed = [f"overlapped fresh b={b}" for b in args.branches]
    adaptive = [f"overlapped {policy} adaptive" for policy in ("fresh", "skip", "auto")]
    modes = ["colocated", "sync", *fixed, *adaptive]
    if args.modes:
        unknown = sorted(set(args.modes) - set(modes))
        if unknown:
            parser.error(f"--modes: unknown {unknown}; choose from {modes}")
        modes = [m for m in modes if m in args.modes]
    runs: list[RunRow] = []
    costs: list[CostRow] = []
    for batch in args.batch:
        target = load_model(target_dir, dtype="float32", num_slots=batch)
        for temperature in args.temperature:
            params = SamplingParams(
                temperature=temperature, max_tokens=args.max_tokens, ignore_eos=True, seed=7
            )
            reference = None
            if temperature == 0.0:
                reference = _run(target, None, batch, prompts, params)[1]
            for mode in modes:
                row = run_mode(
                    target, str(draft_dir), batch, prompts, params, mode, reference,
                    args.transport, args.sparse_top_k,
                )  # fmt: skip
                runs.append(row)
                print(_format_run(runs[-1]), flush=True)
        for branches in args.branches:
            costs.append(measure_costs(target, str(draft_dir), prompts[:batch], branches))
            print(_format_cost(costs[-1]), flush=True)
    if args.json:
        print(json.dumps({"runs": [asdict(r) for r in runs], "costs": [asdict(c) for c in costs]}))


def _format_run(r: RunRow) -> str:
    kinds = " ".join(f"{k}:{v:.2f}" for k, v in r.hit_rate_by_kind.items())
    parts = [
        f"B={r.batch:<2} T={r.temperature:<4} {r.mode:<27}",
        f"tok/s={r.tokens_per_s:7.1f} round={r.round_ms:6.1f}ms acc={r.acceptance_rate:.3f}",
    ]
    if r.hit_rate is not None:
        parts.append(
            f"h={r.hit_rate:.3f} budget={r.mean_budget:.1f} skipped={r.skip_rate:.2f} [{kinds}]"
        )
    if r.bytes_per_seq_round is not None:
        parts.append(
            f"bytes/seq-round={r.bytes_per_seq_round:.0f} wait={r.wait_ms_per_round:.1f}ms"
        )
    if r.is_lossless is not None:
        parts.append(f"lossless={r.is_lossless}")
    return " ".join(parts)


def _format_cost(c: CostRow) -> str:
    return (
        f"B={c.batch:<2} branches={c.branches}: prepare {c.prepare_ms:.1f} ms, fresh propose "
        f"{c.propose_ms:.1f} ms, verify {c.verify_ms:.1f} ms, prepare/verify "
        f"{c.prepare_ms / c.verify_ms:.2f}"
    )


if __name__ == "__main__":
    main()
