"""The verifier shard: owns the truth (the batch, the target's KV cache, the sampling).

It runs the engine in an `EngineLoop` and buffers what each step produces until the serving
process polls for it. Run as a threaded Ray actor: `poll` blocks (up to its timeout) while
`submit` and `abort` keep being served on other threads.
"""

import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from daemon.runtime.engine.builder import BuiltEngine, EngineSpec, build_engine
from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.loop import EngineLoop, LoopOutput
from daemon.runtime.engine.request import Request
from daemon.runtime.engine.stats import EngineStats
from daemon.runtime.errors import (
    EngineOverloadedError,
    EngineStoppedError,
    ModelLoadError,
    RequestError,
    SpecError,
)
from daemon.runtime.parallel.group import TensorParallel, init_group, left_on_failure, pick_address
from daemon.runtime.parallel.leader import close_leader
from daemon.runtime.remote.options import RemoteMode, RemoteOptions
from daemon.runtime.remote.remote_proposer import RemoteProposer
from daemon.runtime.remote.remote_stats import RemoteStats
from daemon.shard.background_load import BackgroundLoad, NotReadyError, Progress
from daemon.shard.node_context import NodeContext
from daemon.shard.pipeline_stage import RayStage
from daemon.shard.ray_transport import NamedActorTransport
from daemon.shard.specs import ShardStatus, VerifierSpec
from daemon.shard.tokenizer_files import read_tokenizer_files

logger = logging.getLogger(__name__)

MAX_POLL_WAIT_S = 5.0
STAGE_LOAD_TIMEOUT_S = 900.0
SPECULATION_CHANGE_TIMEOUT_S = 60.0


@dataclass(slots=True)
class SubmitResult:
    """`submit`'s answer; exceptions do not cross Ray well, so refusals come back as data."""

    accepted: bool
    instance_id: str  # the shard instance that took (or refused) the request
    kind: str = ""  # "request" | "overloaded" | "stopped" | "not_ready" when refused
    message: str = ""


@dataclass(slots=True)
class PollReply:
    instance_id: str  # a restarted verifier answers with a new one: its requests are gone
    state: str
    output: LoopOutput | None  # None when nothing happened within the wait


@dataclass(slots=True)
class VerifierInfo:
    """What the serving process needs to know about the model behind the shard."""

    max_model_len: int
    vocab_size: int
    proposer: str
    num_speculative_tokens: int
    adaptive: bool
    max_batch_size: int
    max_waiting: int | None = None  # requests queued beyond the batch before refusals


@dataclass(slots=True)
class _Running:
    built: BuiltEngine
    loop: EngineLoop


def _summed(progress: Progress) -> Callable[[str, int, int], None]:
    """Per-model loading progress (target, draft) reported as one sum of bytes."""
    seen: dict[str, tuple[int, int]] = {}

    def report(name: str, loaded_bytes: int, total_bytes: int) -> None:
        seen[name] = (loaded_bytes, total_bytes)
        progress(sum(d for d, _ in seen.values()), sum(t for _, t in seen.values()))

    return report


class VerifierShard:
    def __init__(self, spec: VerifierSpec) -> None:
        if spec.num_threads:
            torch.set_num_threads(spec.num_threads)
        self.spec = spec
        self.context = NodeContext.current()
        self._cond = threading.Condition()
        self._pending: LoopOutput | None = None
        # rank 0 of a tensor-parallel target: the other ranks (actors on this node) join here
        self.tp_address = pick_address() if spec.tensor_parallel_size > 1 else None
        self._load = BackgroundLoad(self._build, "verifier")

    # -- loading ----------------------------------------------------------------------------
    def _build(self, progress: Progress) -> _Running:
        spec = self.spec
        speculating = spec.proposer != "none"
        config = EngineConfig(
            max_batch_size=spec.max_batch_size,
            num_speculative_tokens=spec.num_speculative_tokens if speculating else 0,
            adaptive=spec.adaptive and speculating,
            draft_sparse_top_k=spec.sparse_top_k,
            draft_sparse_mass=spec.sparse_mass,
            draft_sparse_max_listed=spec.sparse_max_listed,
            choose_proposal=spec.choose_proposal,
            prefill_chunk_tokens=spec.prefill_chunk_tokens,
        )
        tp = self._join_group()
        with left_on_failure(tp):
            built = build_engine(
                EngineSpec(
                    target=Path(spec.target_dir),
                    draft=Path(spec.draft_dir)
                    if spec.proposer == "draft_model" and spec.draft_dir
                    else None,
                    ngram=spec.proposer == "ngram",
                    dtype=spec.dtype,
                    max_model_len=spec.max_model_len,
                    engine=config,
                    proposer=self._remote_proposer() if spec.proposer == "remote" else None,
                    target_tp=tp,
                    target_layers=spec.layers if spec.pipeline_stages else None,
                    target_stages=self._later_stages() or None,
                ),
                _summed(progress),
            )
        loop = EngineLoop(built.engine, self._collect, max_waiting=spec.max_waiting)
        loop.start()
        logger.info("verifier ready on %s (%s)", self.context.node_name, spec.target_dir)
        return _Running(built, loop)

    def _join_group(self) -> TensorParallel | None:
        spec = self.spec
        if self.tp_address is None:
            return None
        return init_group(
            0, spec.tensor_parallel_size, self.tp_address, timeout_s=spec.tp_timeout_s
        )

    def _later_stages(self) -> list[RayStage]:
        """The pipeline's later stages, by name, once each has loaded (bounded wait)."""
        import ray

        spec = self.spec
        if not spec.pipeline_stages:
            return []
        if spec.tensor_parallel_size > 1:
            raise ModelLoadError("a verifier is either tensor- or pipeline-parallel, not both yet")
        namespace = ray.get_runtime_context().namespace
        stages = []
        for index, name in enumerate(spec.pipeline_stages, start=1):
            try:
                handle = ray.get_actor(name, namespace=namespace)
                status = ray.get(
                    handle.wait_ready.remote(STAGE_LOAD_TIMEOUT_S),
                    timeout=STAGE_LOAD_TIMEOUT_S + 30,
                )
            except Exception as exc:  # not found, died, or never answered
                raise ModelLoadError(f"pipeline stage {index} ({name}) unreachable: {exc}") from exc
            if status.state != "ready":
                raise ModelLoadError(
                    f"pipeline stage {index} ({name}) on {status.node_name} is {status.state}: "
                    f"{status.error or 'still loading'}"
                )
            label = f"stage {index} on {status.node_name}"
            stages.append(RayStage(label, handle, spec.stage_timeout_s))
        return stages

    def _remote_proposer(self) -> RemoteProposer:
        """The drafter shard named in the spec, over Ray; looked up by name, again after any
        failure, so a drafter restarted or moved by `apply` is found."""
        import ray

        name = self.spec.drafter_actor
        if not name:
            raise ModelLoadError("proposer 'remote' needs the drafter's actor name")
        namespace = ray.get_runtime_context().namespace
        transport = NamedActorTransport(name, namespace)
        return RemoteProposer(transport, RemoteOptions(mode=RemoteMode(self.spec.mode)))

    def _collect(self, output: LoopOutput) -> None:
        with self._cond:
            if self._pending is None:
                self._pending = output
            else:
                self._pending.merge(output)
            self._cond.notify_all()

    # -- calls from the control plane and the serving process ----------------------------------
    def _group_down(self) -> str | None:
        """Why the target's tensor-parallel group can no longer run (a rank is gone), if so."""
        try:
            target = self._load.get().built.engine.target
        except NotReadyError:
            return None
        return getattr(target, "broken", None)

    def status(self) -> ShardStatus:
        return self._load.report("verifier", self.context, self._group_down())

    def tensor_parallel_address(self) -> str | None:
        """Where the target's other tensor-parallel ranks join (None: not tensor-parallel)."""
        return self.tp_address

    def wait_ready(self, timeout_s: float) -> ShardStatus:
        """Block until loaded (or failed) or `timeout_s` passed, then report."""
        self._load.wait(timeout_s)
        return self.status()

    def info(self) -> VerifierInfo:
        running = self._load.get()
        engine = running.built.engine
        proposer = engine.proposer.name if engine.proposer is not None else "none"
        return VerifierInfo(
            max_model_len=engine.target.max_model_len,
            vocab_size=engine.target.vocab_size,
            proposer=proposer,
            num_speculative_tokens=engine.config.num_speculative_tokens,
            adaptive=engine.config.adaptive,
            max_batch_size=engine.config.max_batch_size,
            max_waiting=self.spec.max_waiting,
        )

    def tokenizer_files(self) -> dict[str, bytes]:
        return read_tokenizer_files(Path(self.spec.target_dir))

    def submit(self, request: Request) -> SubmitResult:
        instance = self.context.instance_id
        group_down = self._group_down()
        if group_down:  # refused as stopped: a router sends the request to another replica
            return SubmitResult(False, instance, "stopped", group_down)
        try:
            self._load.get().loop.submit(request)
        except NotReadyError as exc:
            return SubmitResult(False, instance, "not_ready", str(exc))
        except RequestError as exc:
            return SubmitResult(False, instance, "request", str(exc))
        except EngineOverloadedError as exc:
            return SubmitResult(False, instance, "overloaded", str(exc))
        except (EngineStoppedError, SpecError) as exc:
            return SubmitResult(False, instance, "stopped", str(exc))
        return SubmitResult(True, instance)

    def abort(self, request_id: str) -> None:
        try:
            self._load.get().loop.abort(request_id)
        except NotReadyError:
            return

    def poll(self, max_wait_s: float) -> PollReply:
        """What the engine produced since the last poll, waiting up to `max_wait_s` for it."""
        wait_s = min(max(max_wait_s, 0.0), MAX_POLL_WAIT_S)
        with self._cond:
            if self._pending is None:
                self._cond.wait(wait_s)
            output, self._pending = self._pending, None
        return PollReply(self.context.instance_id, self._load.state, output)

    def set_speculation(
        self, num_speculative_tokens: int, adaptive: bool, forget_costs: bool = False
    ) -> None:
        """Change k (or the adaptive ceiling) without reloading anything; `forget_costs`
        drops the round costs measured so far (engine.py)."""
        running = self._load.get()
        running.loop.call_between_steps(
            lambda engine: engine.set_speculation(num_speculative_tokens, adaptive, forget_costs),
            timeout_s=SPECULATION_CHANGE_TIMEOUT_S,
        )
        self.spec.num_speculative_tokens, self.spec.adaptive = num_speculative_tokens, adaptive

    def speculation_stats(self, reset: bool = False) -> dict[str, object]:
        """The engine's running totals and, with a remote drafter, the remote proposer's (hit
        rate, waits, bytes); `reset` starts both afresh after reading (benchmarks)."""

        def read(engine: SpecEngine) -> dict[str, object]:
            out: dict[str, object] = {"engine": dataclasses.asdict(engine.stats)}
            remote = engine.proposer if isinstance(engine.proposer, RemoteProposer) else None
            if remote is not None:
                stats = dataclasses.asdict(remote.stats)
                stats.pop("last_round", None)
                out["remote"] = {
                    k: dict(v) if isinstance(v, Counter) else v for k, v in stats.items()
                }
            if reset:
                engine.stats = EngineStats()
                if remote is not None:
                    remote.stats = RemoteStats()
            return out

        running = self._load.get()
        return running.loop.call_between_steps(read, timeout_s=SPECULATION_CHANGE_TIMEOUT_S)

    def stop(self) -> None:
        """End every request in flight (their last deltas wait for the next poll)."""
        try:
            running = self._load.get()
        except NotReadyError:
            return
        running.loop.stop()
        close_leader(running.built.engine.target)
        self._load.stop()
