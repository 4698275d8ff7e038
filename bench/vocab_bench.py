"""Speculation at a real vocabulary size: per-round engine cost and acceptance.

    python -m bench.vocab_bench [--vocab 151936] [--batch 16] [--k 4] [--rounds 12]
    python -m bench.vocab_bench --pair demo --temperatures 1.0 --sparse-top-k 32,4096
    python -m bench.vocab_bench --pair demo --sparse-top-k 254 --sparse-mass 0.9,0.99,1
    python -m bench.vocab_bench --pair demo --temperatures 1.0 --sparse-top-k 32 --max-listed 2048
    python -m bench.vocab_bench --device cuda
    python -m bench.vocab_bench --temperatures 0.7 --sparse-top-k 0 --draft-seed 1

A tiny random Llama with Qwen's vocabulary (151,936) is both draft and target (two loaded
copies of one checkpoint), so every draft should be accepted whatever the temperature: the
acceptance measures what the proposal format loses, and the time outside the two models'
forward passes measures what sampling at this vocabulary costs the engine. For greedy and each
temperature it prints, per round: the verify forward, the draft forwards, everything else
(sampling, rejection, bookkeeping) and its ratio to the verify forward; the acceptance; and
the proposal's bytes per round per sequence on the wire. `--pair demo` runs the trained demo
pair instead (code prompts), where several `--sparse-top-k` widths compare the compact
proposal with full-distribution drafting (width = the vocabulary). `--sparse-mass` lists no
more of the draft's best tokens than it takes to cover that mass (fewer bytes where the draft
is confident); `--max-listed` lets a sequence widen its lists up to that many tokens while the
verifier rejects its tail drafts (proposers/tail_verdicts.py); the table shows the tokens
listed per sampled draft and the bytes that makes. `--draft-seed N` makes the random pair's
draft another random model (initialised from seed N): acceptance falls, and the rest of a
round shows what rejected drafts cost the engine at this vocabulary.
Width 0 is coupled drafting (the token alone, matched against the verifier's own draw with
the same Gumbel field); by default the bench compares it with the default width. Width `auto`
is what the engine does by default: the default width measured against coupled drafts, the
faster kept (engine/proposal_chooser.py); the row says which share of rounds went coupled.

    python -m bench.vocab_bench --temperatures 0.7,1.0 --sparse-top-k 32,0,auto --rounds 96
    python -m bench.vocab_bench --pair demo --temperatures 1.0 --sparse-top-k 32,0,auto
On `--device cuda` the draft's forwards are timed to the device's completion (a synchronize
after each), so the split between forwards and the rest is the device's, not the launches'.
"""

import argparse
import dataclasses
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.table import Table

from bench.arg_types import DEVICES, device_problem
from bench.workload import load_prompt_texts, repeat_to, tokenize
from daemon.runtime.device import synchronize
from daemon.runtime.engine.builder import load_tokenizer
from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.request import Request
from daemon.runtime.engine.stats import EngineStats
from daemon.runtime.model import load_model
from daemon.runtime.model.batch import ForwardBatch
from daemon.runtime.model.loader import DTYPE_CHOICES
from daemon.runtime.model.protocol import CausalLM
from daemon.runtime.proposers.base import Proposals, ProposeRequest
from daemon.runtime.proposers.draft_model import DraftModelProposer
from daemon.runtime.remote.wire_budget import bytes_per_round_per_seq
from daemon.runtime.sampling.params import SamplingParams
from daemon.runtime.sampling.quantized import MAX_LISTED
from specctl.console import make_console
from specctl.demo_pair import DEMO_PROMPTS_CODE, require_demo_pair
from tests.tiny_models import make_tiny_checkpoint

QWEN_VOCAB = 151_936
CHOOSER_WARMUP_ROUNDS = 24  # the chooser measures each form 8 rounds before it chooses
PROMPT_LEN = 16


class TimedModel:
    """Measures the wall time of a model's forward passes, to the device's completion
    (everything else passes through)."""

    def __init__(self, model: CausalLM) -> None:
        self._model = model
        self.forward_s = 0.0

    def forward(self, batch: ForwardBatch) -> torch.Tensor | None:
        start = time.perf_counter()
        try:
            return self._model.forward(batch)
        finally:
            synchronize(self._model.device)
            self.forward_s += time.perf_counter() - start

    def __getattr__(self, name: str) -> object:
        return getattr(self._model, name)


class ListedCounter:
    """Counts the tokens the proposer's sampled drafts list (what their proposals carry)."""

    def __init__(self, proposer: DraftModelProposer) -> None:
        self._propose = proposer.propose
        proposer.propose = self._counting  # type: ignore[method-assign]
        self.total = self.drafts = 0
        self.rounds = self.coupled_rounds = 0  # proposing rounds; those asked for coupled drafts

    def _counting(self, request: ProposeRequest) -> Proposals:
        proposals = self._propose(request)
        self.rounds += 1
        self.coupled_rounds += int(request.coupled)
        if proposals.sparse_probs is not None and proposals.sparse_tail is not None:
            listed = (proposals.sparse_probs > 0).sum(dim=-1)  # [B, K]
            sampled = (listed > 0) | (proposals.sparse_tail > 0)
            self.total += int(listed[sampled].sum())
            self.drafts += int(sampled.sum())
        return proposals

    def reset(self) -> None:
        self.total = self.drafts = 0
        self.rounds = self.coupled_rounds = 0

    @property
    def coupled_share(self) -> float:
        return self.coupled_rounds / self.rounds if self.rounds else 0.0

    @property
    def mean(self) -> float:
        return self.total / self.drafts if self.drafts else 0.0


@dataclass(slots=True)
class VocabResult:
    mode: str
    rounds: int
    verify_ms: float  # the target's forward per round
    draft_forward_ms: float  # the draft's forwards per round
    other_ms: float  # the rest of the round: sampling, rejection, bookkeeping
    acceptance: float
    listed: float  # tokens a sampled draft's proposal lists, on average (0: greedy)
    bytes_per_seq: int | None  # proposal bytes per round per sequence on the wire (None: too
    # wide for the wire, a local drafter only)

    @property
    def other_over_verify(self) -> float:
        return self.other_ms / self.verify_ms if self.verify_ms else float("inf")


def run_mode(
    target: CausalLM,
    draft: TimedModel,
    prompts: list[list[int]],
    temperature: float,
    k: int,
    rounds: int,
    sparse_top_k: int,
    sparse_mass: float = 1.0,
    max_listed: int | None = None,
    choose: bool = False,
) -> VocabResult:
    """One engine run, every prompt at once (batch = len(prompts)); rows widen their lists up
    to max_listed tokens (proposers/tail_verdicts.py; None: they do not). `choose`: the engine
    measures the listed proposals against coupled drafts and keeps the faster
    (engine/proposal_chooser.py); its warm-up then runs CHOOSER_WARMUP_ROUNDS rounds, in which
    it measures both (as a server has after its first requests); else they are listed."""
    batch = len(prompts)
    params = SamplingParams(temperature=temperature, max_tokens=rounds * (k + 1), ignore_eos=True)
    # sampled requests are seeded, except where the engine chooses the form: it keeps a
    # seeded request's listed proposals (engine/proposal_chooser.py)
    seed = 1234 if temperature > 0 and not choose else None
    config = EngineConfig(
        max_batch_size=batch,
        num_speculative_tokens=k,
        draft_sparse_top_k=sparse_top_k,
        draft_sparse_mass=sparse_mass,
        draft_sparse_max_listed=max_listed,
        choose_proposal=choose,
    )
    proposer = DraftModelProposer(
        draft,  # type: ignore[arg-type]
        sparse_top_k=sparse_top_k,
        sparse_mass=sparse_mass,
        max_listed=max_listed,
    )
    listed = ListedCounter(proposer)
    engine = SpecEngine(target, proposer, config, eos_token_ids=[])

    def requests(tag: str) -> list[Request]:
        return [
            Request(
                f"{tag}{i}", p, dataclasses.replace(params, seed=None if seed is None else seed + i)
            )
            for i, p in enumerate(prompts)
        ]

    warm_rounds = CHOOSER_WARMUP_ROUNDS if choose else 2
    warm = SamplingParams(
        temperature=temperature, max_tokens=warm_rounds * (k + 1), ignore_eos=True
    )
    engine.generate(Request(f"w{i}", p, warm) for i, p in enumerate(prompts))
    engine.stats = EngineStats()
    draft.forward_s = 0.0
    listed.reset()
    engine.generate(requests("r"))
    stats = engine.stats
    draft_fwd = draft.forward_s
    # the draft's prefill of the measured prompts happened inside the engine's prefill
    num = max(stats.num_rounds, 1)
    other = stats.step_time_s - stats.prefill_time_s - stats.verify_time_s - stats.draft_time_s
    sampling_in_draft = max(0.0, stats.draft_time_s - draft_fwd)
    mode = "greedy" if temperature == 0 else f"T={temperature:g}"
    if temperature > 0:
        mode += ", coupled" if sparse_top_k == 0 else f", top-{sparse_top_k}+tail"
        mode += f" or coupled, measured ({listed.coupled_share:.0%} coupled)" if choose else ""
    mode += f", mass {sparse_mass:g}" if temperature > 0 and sparse_mass < 1.0 else ""
    widens = temperature > 0 and proposer.sampler.max_listed > sparse_top_k
    mode += f", widening to {proposer.sampler.max_listed}" if widens else ""
    sampled = temperature > 0
    wire_bytes = None
    if sparse_top_k <= MAX_LISTED or not sampled:

        def wire(width: int) -> float:
            return bytes_per_round_per_seq(
                context_len=PROMPT_LEN, k=k, sparse_top_k=width, sampled=sampled,
                vocab_size=target.vocab_size,
            )  # fmt: skip

        # as many as were listed (coupled drafts: none, the token alone), in their share
        share = 1.0 if sparse_top_k == 0 else listed.coupled_share
        listed_bytes = wire(max(1, round(listed.mean))) if share < 1.0 else 0.0
        wire_bytes = round(share * wire(0) + (1.0 - share) * listed_bytes)
    return VocabResult(
        mode=mode,
        rounds=stats.num_rounds,
        verify_ms=1000 * stats.verify_time_s / num,
        draft_forward_ms=1000 * min(draft_fwd, stats.draft_time_s) / num,
        other_ms=1000 * (other + sampling_in_draft) / num,
        acceptance=stats.acceptance_rate,
        listed=listed.mean,
        bytes_per_seq=wire_bytes,
    )


def results_table(results: list[VocabResult], title: str) -> Table:
    table = Table(title=title)
    for col in (
        "mode",
        "rounds",
        "verify fwd ms",
        "draft fwd ms",
        "rest ms",
        "rest / verify",
        "acceptance",
        "listed/draft",
        "bytes/round/seq",
    ):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(
            r.mode,
            str(r.rounds),
            f"{r.verify_ms:.1f}",
            f"{r.draft_forward_ms:.1f}",
            f"{r.other_ms:.1f}",
            f"{r.other_over_verify:.2f}",
            f"{r.acceptance:.3f}",
            f"{r.listed:.0f}",
            "local only" if r.bytes_per_seq is None else str(r.bytes_per_seq),
        )
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--pair", choices=("random", "demo"), default="random",
        help="random: a tiny random Llama at --vocab as draft and target; demo: the demo pair",
    )  # fmt: skip
    parser.add_argument("--vocab", type=int, default=QWEN_VOCAB)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=12, help="rounds per request (about)")
    parser.add_argument("--temperatures", default="0,0.7,1.0")
    parser.add_argument(
        "--sparse-top-k", default=f"{EngineConfig().draft_sparse_top_k},0",
        help="comma-separated proposal widths to compare (above 4095: local drafters only; "
        "0: coupled drafting, the token alone; auto: the default width measured against "
        "coupled drafts by the engine, which keeps the faster)",
    )  # fmt: skip
    parser.add_argument(
        "--sparse-mass", default="1.0",
        help="comma-separated: list no more tokens than it takes to cover this mass",
    )  # fmt: skip
    parser.add_argument(
        "--max-listed", type=int, default=None,
        help="rows widen their lists up to this many tokens while the verifier rejects their "
        "tail drafts (proposal_max_tokens; default: they list --sparse-top-k)",
    )  # fmt: skip
    parser.add_argument(
        "--draft-seed", type=int, default=None,
        help="random pair only: the draft is another random model, initialised from this seed",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument(
        "--dtype", choices=DTYPE_CHOICES, default="float32",
        help="the models' weights (float32: what `specctl demo` runs on a CPU, where the "
        "native kernels take it; auto: each checkpoint's own, bfloat16 for the demo target)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    problem = device_problem(args.device)
    if problem:
        parser.error(problem)
    if args.draft_seed is not None and args.pair != "random":
        parser.error("--draft-seed applies to the random pair only (--pair random)")
    torch.set_num_threads(args.threads)
    console = make_console()
    default_width = EngineConfig().draft_sparse_top_k
    # (width, whether the engine measures it against coupled drafts)
    widths = [
        (default_width, True) if w == "auto" else (int(w), False)
        for w in args.sparse_top_k.split(",")
    ]
    masses = [float(m) for m in args.sparse_mass.split(",")]
    temperatures = [float(t) for t in args.temperatures.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        if args.pair == "demo":
            target_dir, draft_dir = require_demo_pair()
            tokenizer = load_tokenizer(target_dir)
            texts = load_prompt_texts(DEMO_PROMPTS_CODE)
            prompts = repeat_to(tokenize(tokenizer, texts), args.batch)[: args.batch]
            title = f"demo pair, B={args.batch}, k={args.k}"
        else:
            target_dir = draft_dir = make_tiny_checkpoint(
                Path(tmp) / "m", vocab_size=args.vocab, hidden_size=64, num_layers=2,
                with_tokenizer=False,
            )  # fmt: skip
            if args.draft_seed is not None:
                draft_dir = make_tiny_checkpoint(
                    Path(tmp) / "d", vocab_size=args.vocab, hidden_size=64, num_layers=2,
                    with_tokenizer=False, seed=args.draft_seed,
                )  # fmt: skip
            gen = torch.Generator().manual_seed(0)
            prompts = [
                torch.randint(0, args.vocab, (PROMPT_LEN,), generator=gen).tolist()
                for _ in range(args.batch)
            ]
            same = "draft = target" if args.draft_seed is None else f"draft seed {args.draft_seed}"
            title = f"V={args.vocab}, {same}, B={args.batch}, k={args.k}"
        target = load_model(target_dir, num_slots=args.batch, device=args.device, dtype=args.dtype)
        draft = TimedModel(
            load_model(draft_dir, num_slots=args.batch, device=args.device, dtype=args.dtype)
        )
        results = [
            run_mode(
                target,
                draft,
                prompts,
                t,
                args.k,
                args.rounds,
                w,
                m,
                max_listed=max(w, args.max_listed) if args.max_listed and w else None,
                choose=choose,
            )
            for t in temperatures
            for w, choose in (widths if t > 0 else widths[:1])
            for m in (masses if t > 0 and w > 0 else masses[:1])
        ]
    console.print(results_table(results, f"{title}, {args.device}, {args.threads} thread(s)"))


if __name__ == "__main__":
    main()
