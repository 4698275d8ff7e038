"""Run specctl's own engine on a workload: target-only, fixed-k and adaptive speculation.

The target and draft are loaded once; every configuration builds a fresh SpecEngine over the
same models, so the comparison is side by side in one process.
"""

import dataclasses
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from daemon.runtime.engine.builder import check_same_vocabulary, eos_token_ids, load_tokenizer
from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.graphs_ahead import GraphCapture
from daemon.runtime.engine.request import Request, RequestOutput
from daemon.runtime.engine.stats import EngineStats
from daemon.runtime.model import load_model
from daemon.runtime.model.protocol import CausalLM
from daemon.runtime.proposers.draft_model import DraftModelProposer
from daemon.runtime.sampling.params import SamplingParams

SEED_BASE = 1234  # a sampled request's seed: this plus its index in the workload


@dataclass(slots=True)
class RunResult:
    engine: str  # "specctl"
    mode: str  # "target-only" | "spec k=4" | "spec adaptive"
    concurrency: int
    num_requests: int
    num_tokens: int
    wall_s: float
    tokens_per_s: float
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    num_rounds: int
    num_drafts: int  # rounds x sequences that drafted
    accepted_per_pos: list[int]  # [k] drafts accepted at each position
    draft_time_s: float
    verify_time_s: float
    prefill_time_s: float
    overhead_per_round_ms: float
    output_token_ids: list[list[int]]
    repeats_in_order: list[float] = field(default_factory=list)  # every repeat's, as run
    choose_per_round_us: float = 0.0  # the controller choosing k, per round

    @property
    def repeats_tokens_per_s(self) -> list[float]:
        """Every repeat's tokens/s, sorted."""
        return sorted(self.repeats_in_order)

    def per_position_acceptance(self, k: int) -> float | None:
        """The i.i.d. per-position acceptance probability that fits this fixed-k run (the `a` of
        (1 - a^(k+1)) / (1 - a)): accepted drafts over drafts reached, where every round that
        did not accept all k drafts reached exactly one rejected position."""
        accepted = sum(self.accepted_per_pos)
        if not self.num_drafts:
            return None
        full = self.accepted_per_pos[k - 1] if len(self.accepted_per_pos) >= k else 0
        reached = accepted + self.num_drafts - full
        return accepted / reached if reached else None

    def summary(self) -> dict[str, object]:
        data = asdict(self)
        data.pop("output_token_ids")
        data["repeats_tokens_per_s"] = self.repeats_tokens_per_s
        return data


@dataclass(slots=True)
class RunSpec:
    """One configuration of a group measured side by side (`SpecBench.run_group`)."""

    mode: str  # the report's name for it
    k: int = 0
    adaptive: bool = False
    prefill_chunk: int | None = None  # EngineConfig.prefill_chunk_tokens


class SpecBench:
    """Holds the loaded pair; `run` measures one configuration at one concurrency, `run_group`
    several side by side."""

    def __init__(
        self,
        target_dir: Path,
        draft_dir: Path,
        dtype: str,
        max_batch: int,
        device: str = "cpu",
        *,
        num_engines: int = 1,
        max_model_len: int | None = None,
    ) -> None:
        """num_engines: how many engines of up to max_batch sequences a group runs at once,
        each in its own range of KV-cache slots (run_group); max_model_len: the context the
        KV cache holds per slot (None: the checkpoint's), which keeps that many slots small."""
        self.tokenizer = load_tokenizer(target_dir)
        check_same_vocabulary(target_dir, draft_dir, self.tokenizer)
        self.eos = eos_token_ids(target_dir, self.tokenizer)
        self.target: CausalLM = load_model(
            target_dir,
            dtype=dtype,
            num_slots=max_batch * num_engines,
            device=device,
            max_model_len=max_model_len,
        )
        # what each engine captured as CUDA graphs before its first request (none on a CPU)
        self.graph_captures: list[GraphCapture] = []
        self.draft: CausalLM = load_model(
            draft_dir,
            dtype=dtype,
            num_slots=max_batch * num_engines,
            max_model_len=self.target.max_model_len,
            device=device,
        )

    def engine(
        self,
        concurrency: int,
        k: int,
        adaptive: bool,
        first_slot: int = 0,
        prefill_chunk_tokens: int | None = None,
    ) -> SpecEngine:
        proposer = DraftModelProposer(self.draft) if k > 0 else None
        config = EngineConfig(
            max_batch_size=concurrency,
            num_speculative_tokens=k,
            adaptive=adaptive,
            prefill_chunk_tokens=prefill_chunk_tokens,
        )
        return SpecEngine(
            self.target, proposer, config, eos_token_ids=self.eos, first_slot=first_slot
        )

    def run(
        self,
        mode: str,
        prompts: list[list[int]],
        max_tokens: int,
        concurrency: int,
        k: int = 0,
        adaptive: bool = False,
        repeats: int = 1,
        temperature: float = 0.0,
    ) -> RunResult:
        """Greedy (temperature 0), EOS ignored, so every configuration generates exactly the
        same tokens; above 0 every request samples with its own seed (SEED_BASE + its index).

        The measured engine is warmed first on the same workload shape (as a server is after
        its first requests): caches and kernels are warm, and adaptive mode has measured its
        costs and acceptance. The workload is then measured `repeats` times on that engine
        (statistics reset before each) and the median repeat is returned: one short run is
        at the mercy of a slow moment, and the best of several noisy fixed-k runs beats one
        noisy adaptive run by luck alone."""
        return self.run_group(
            [RunSpec(mode, k, adaptive)], prompts, max_tokens, concurrency, repeats, temperature
        )[0]

    def run_group(
        self,
        specs: list[RunSpec],
        prompts: list[list[int]],
        max_tokens: int,
        concurrency: int,
        repeats: int = 1,
        temperature: float = 0.0,
    ) -> list[RunResult]:
        """`run` for several configurations side by side: each gets its own engine, warmed,
        and the repeats go round-robin over them (repeat 1 of every configuration, then
        repeat 2, ...), so a slow spell of a shared machine costs them alike instead of
        whichever ran then. At concurrency 1 the round robin goes request by request within
        a repeat (request 1 on every configuration, then request 2, ...): the requests run
        one at a time either way, so the work is the same, and the configurations are
        compared within a second or two instead of a minute. On the 2-core bench machine two
        engines of one configuration measured whole workload by whole workload differed by up
        to 14% a repeat (ratios 0.887-1.144, stdev 0.086, six repeats); request by request,
        0.982-1.024 (stdev 0.014). Above concurrency 1, where the models have a range of
        KV-cache slots for every configuration (num_engines), the engines hold their batches
        at once and step in turn, the one with the least time so far next (_measure_by_step):
        the configurations are compared step by step, ~0.1 s apart, instead of a whole
        workload (~10 s) apart. Else each runs its whole workload in turn.
        The median repeat of each, in the order of `specs`."""
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True)
        by_step = concurrency > 1 and len(specs) * concurrency <= self.target.num_slots
        engines = [
            self.engine(concurrency, spec.k, spec.adaptive, i * concurrency if by_step else 0)
            for i, spec in enumerate(specs)
        ]
        self.graph_captures += [e.graph_capture for e in engines if e.graph_capture.num_graphs]
        warmup = prompts[: max(concurrency, 1)]
        for engine in engines:
            engine.generate(Request(f"warmup{i}", p, params) for i, p in enumerate(warmup))
        results: list[list[RunResult]] = [[] for _ in specs]
        modes = [spec.mode for spec in specs]
        for i in range(repeats):
            if concurrency == 1:
                measured = self._measure_by_request(engines, modes, prompts, params, f"r{i}")
            elif by_step:
                measured = self._measure_by_step(engines, modes, prompts, params, f"r{i}", i)
            else:
                measured = [
                    self._measure(engine, mode, prompts, params, concurrency, f"r{i}")
                    for mode, engine in zip(modes, engines, strict=True)
                ]
            for runs, result in zip(results, measured, strict=True):
                runs.append(result)
        return [median_run(runs) for runs in results]

    def _measure(
        self,
        engine: SpecEngine,
        mode: str,
        prompts: list[list[int]],
        params: SamplingParams,
        concurrency: int,
        tag: str,
    ) -> RunResult:
        """The whole workload on one engine, `concurrency` requests at a time."""
        engine.stats = EngineStats()
        requests = [Request(f"{tag}-{i}", p, _seeded(params, i)) for i, p in enumerate(prompts)]
        start = time.perf_counter()
        outputs = engine.generate(requests)
        wall_s = time.perf_counter() - start
        return _result(engine, mode, outputs, wall_s, concurrency)

    def _measure_by_request(
        self,
        engines: list[SpecEngine],
        modes: list[str],
        prompts: list[list[int]],
        params: SamplingParams,
        tag: str,
    ) -> list[RunResult]:
        """The workload at concurrency 1 on every engine, request by request in turn: each
        engine's wall time is the sum of its own requests' (run_group says why)."""
        walls = [0.0] * len(engines)
        outputs: list[list[RequestOutput]] = [[] for _ in engines]
        for engine in engines:
            engine.stats = EngineStats()
        for i, prompt in enumerate(prompts):
            for j, engine in enumerate(engines):
                request = Request(f"{tag}-{i}", prompt, _seeded(params, i))
                start = time.perf_counter()
                outputs[j] += engine.generate([request])
                walls[j] += time.perf_counter() - start
        return [
            _result(engine, mode, out, wall_s, 1)
            for engine, mode, out, wall_s in zip(engines, modes, outputs, walls, strict=True)
        ]

    def _measure_by_step(
        self,
        engines: list[SpecEngine],
        modes: list[str],
        prompts: list[list[int]],
        params: SamplingParams,
        tag: str,
        first: int = 0,
    ) -> list[RunResult]:
        """The whole workload on every engine at once (each in its own slots), one step at a
        time, always of the engine with the least time so far: their times advance together,
        so a slow spell of the machine falls on all of them alike. Each engine's wall time is
        the sum of its own steps'. Ties (the first steps) go from engine `first` on: the
        caller turns it with the repeat, so no configuration always prefills first."""
        ids = [f"{tag}-{i}" for i in range(len(prompts))]
        walls = [0.0] * len(engines)
        done: list[dict[str, RequestOutput]] = [{} for _ in engines]
        for engine in engines:
            engine.stats = EngineStats()
            for i, (request_id, prompt) in enumerate(zip(ids, prompts, strict=True)):
                engine.add_request(Request(request_id, prompt, _seeded(params, i)))
        while busy := [j for j, engine in enumerate(engines) if engine.has_unfinished()]:
            j = min(busy, key=lambda j: (walls[j], (j - first) % len(engines)))
            start = time.perf_counter()
            step = engines[j].step()
            walls[j] += time.perf_counter() - start
            done[j].update((out.request_id, out) for out in step.finished)
        return [
            _result(engine, mode, [outs[i] for i in ids], wall_s, engine.config.max_batch_size)
            for engine, mode, outs, wall_s in zip(engines, modes, done, walls, strict=True)
        ]


def _result(
    engine: SpecEngine,
    mode: str,
    outputs: list[RequestOutput],
    wall_s: float,
    concurrency: int,
) -> RunResult:
    """A measured run from its outputs, its wall time and the engine's statistics over it."""
    stats = engine.stats
    num_tokens = sum(len(o.token_ids) for o in outputs)
    speculated = stats.num_draft_tokens > 0
    return RunResult(
        engine="specctl",
        mode=mode,
        concurrency=concurrency,
        num_requests=len(outputs),
        num_tokens=num_tokens,
        wall_s=wall_s,
        tokens_per_s=num_tokens / wall_s,
        acceptance_rate=stats.acceptance_rate if speculated else None,
        mean_acceptance_length=stats.mean_acceptance_length if speculated else None,
        num_rounds=stats.num_rounds,
        num_drafts=stats.num_drafts,
        accepted_per_pos=list(stats.accepted_per_pos),
        draft_time_s=stats.draft_time_s,
        verify_time_s=stats.verify_time_s,
        prefill_time_s=stats.prefill_time_s,
        overhead_per_round_ms=1000 * stats.overhead_time_s / max(stats.num_rounds, 1),
        output_token_ids=[o.token_ids for o in outputs],
        choose_per_round_us=1e6 * stats.choose_time_s / max(stats.num_rounds, 1),
    )


def _seeded(params: SamplingParams, index: int) -> SamplingParams:
    """A sampled request's own seed (the same in every configuration); greedy ones need none."""
    if params.is_greedy:
        return params
    return dataclasses.replace(params, seed=SEED_BASE + index)


def median_run(runs: list[RunResult]) -> RunResult:
    """The median repeat by tokens/s, carrying every repeat's tokens/s."""
    ordered = sorted(runs, key=lambda r: r.tokens_per_s)
    median = ordered[(len(ordered) - 1) // 2]
    median.repeats_in_order = [r.tokens_per_s for r in runs]
    return median
