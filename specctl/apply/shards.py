"""The shards a plan asks for, and bringing them to that state on the Ray cluster.

A shard that already runs with the same fingerprint (model, dtype, node, sizes, proposer) is
left alone; a verifier whose only change is its speculation settings (k, adaptive) is changed
live; anything else is replaced. Where that stops a running shard, every shard the apply starts
is first found to load on its node (preflight.py); where one fails to load all the same, the
apply puts back what ran before (rollback.py). Drafters are deployed before the verifiers that
reach them.
"""

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from daemon.shard.specs import DrafterSpec, RankSpec, ShardStatus, StageSpec, VerifierSpec
from specctl.apply.cluster_up import ClusterUpError
from specctl.apply.events import ApplyEvents
from specctl.apply.preflight import check_before_replacing
from specctl.apply.state import ShardState
from specctl.config.cluster import ClusterConfig
from specctl.config.errors import ConfigError
from specctl.deploy.actors import (
    Placement,
    ask_statuses,
    create_drafter,
    create_stage,
    create_verifier,
    find_actor,
    first_line,
    kill_actor,
    start_ranks,
)
from specctl.planner.deployable import not_deployable
from specctl.planner.plan import Plan, ShardPlan

STATUS_TIMEOUT_S = 30.0
LOAD_POLL_S = 0.5
DEFAULT_LOAD_TIMEOUT_S = 900.0
SHARD_THREADS = 1  # torch threads per shard process on CPU nodes
DRAFTER_RESTARTS = -1  # Ray restarts a dead drafter for as long as its node can hold it
VERIFIER_RESTARTS = 3


class ShardError(Exception):
    """A shard cannot be deployed as planned, or failed to load; the message says which."""


class ReplacementFailed(ShardError):
    """Deploying failed after it had changed what runs: `touched` names the shards no longer
    as they were (stopped, started, or their speculation changed live)."""

    def __init__(self, message: str, touched: set[str]) -> None:
        super().__init__(message)
        self.touched = touched


@dataclass(slots=True)
class DesiredShard:
    actor: str
    role: str
    replica: int
    node: str
    spec: VerifierSpec | DrafterSpec | StageSpec
    fingerprint: str
    speculation: str  # verifiers: the settings applied live

    @property
    def step_name(self) -> str:
        """How apply's steps name it: "verifier r0", "stage1 r0" (a replica's stages apart)."""
        role = self.actor.rsplit(".", 1)[-1] if self.role == "stage" else self.role
        return f"{role} r{self.replica}"

    def state(self) -> ShardState:
        return ShardState(
            self.actor, self.role, self.replica, self.node, self.fingerprint, self.speculation
        )


def desired_shards(config: ClusterConfig, plan: Plan, threads: int | None) -> list[DesiredShard]:
    """Per replica: the drafter, the verifier's later pipeline stages, then the verifier,
    which reaches them by name."""
    shards: list[DesiredShard] = []
    for replica in range(plan.replicas):
        planned = plan.shards_of(replica)
        verifiers = [s for s in planned if s.role == "verifier"]
        drafter = next((s for s in planned if s.role == "drafter"), None)
        _check_supported(verifiers, drafter)
        verifiers.sort(key=lambda v: v.stage)
        verifier = verifiers[0]  # the first pipeline stage, or the whole target
        prefix = f"{plan.deployment}.r{replica}"
        stages = [_stage(prefix, stage, threads) for stage in verifiers[1:]]
        # a tensor-parallel drafter is a group of its own (a process joins one group): its own
        # shard, even on the verifier's node
        remote_drafter = drafter is not None and (
            drafter.node != verifier.node or drafter.tensor_parallel_size > 1
        )
        if remote_drafter:
            assert drafter is not None
            shards.append(_drafter(prefix, config, drafter, verifier, threads))
        shards.extend(stages)
        shards.append(
            _verifier(prefix, config, plan, verifier, drafter, remote_drafter, threads, stages)
        )
    return shards


def _check_supported(verifiers: list[ShardPlan], drafter: ShardPlan | None) -> None:
    if reasons := not_deployable([*verifiers, *([drafter] if drafter else [])]):
        raise ShardError("; ".join(reasons))


def _fingerprint(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _drafter(
    prefix: str,
    config: ClusterConfig,
    drafter: ShardPlan,
    verifier: ShardPlan,
    threads: int | None,
) -> DesiredShard:
    speculation = config.deployment.speculation
    spec = DrafterSpec(
        draft_dir=drafter.model_path,
        dtype=drafter.dtype,
        max_batch_size=verifier.max_batch_size,
        max_model_len=verifier.max_model_len,
        num_threads=threads,
        tensor_parallel_size=drafter.tensor_parallel_size,
        sparse_top_k=speculation.proposal_tokens,
        sparse_mass=speculation.proposal_mass,
        sparse_max_listed=speculation.proposal_max_tokens,
        prefill_chunk_tokens=config.server.prefill_chunk_tokens,
    )
    fingerprint = _fingerprint({"node": drafter.node, **asdict(spec)})
    return DesiredShard(
        f"{prefix}.drafter", "drafter", drafter.replica, drafter.node, spec, fingerprint, ""
    )


def _stage(prefix: str, stage: ShardPlan, threads: int | None) -> DesiredShard:
    """A later stage of a pipeline-parallel verifier (deployed before the verifier, which
    reaches it by name)."""
    spec = StageSpec(
        model_dir=stage.model_path,
        layers=(stage.layer_start, stage.layer_end),
        num_slots=stage.max_batch_size,
        max_model_len=stage.max_model_len,
        dtype=stage.dtype,
        num_threads=threads,
    )
    fingerprint = _fingerprint({"node": stage.node, **asdict(spec)})
    actor = f"{prefix}.stage{stage.stage}"
    return DesiredShard(actor, "stage", stage.replica, stage.node, spec, fingerprint, "")


def _verifier(
    prefix: str,
    config: ClusterConfig,
    plan: Plan,
    verifier: ShardPlan,
    drafter: ShardPlan | None,
    remote_drafter: bool,
    threads: int | None,
    stages: list[DesiredShard],
) -> DesiredShard:
    speculation = config.deployment.speculation
    if drafter is None:
        proposer, draft_dir = ("ngram" if config.deployment.drafter.is_ngram else "none"), None
    elif remote_drafter:
        proposer, draft_dir = "remote", None
    else:  # the drafter's node is the verifier's: run it in the verifier's process
        proposer, draft_dir = "draft_model", drafter.model_path
    spec = VerifierSpec(
        target_dir=verifier.model_path,
        dtype=verifier.dtype,
        max_batch_size=verifier.max_batch_size,
        max_model_len=verifier.max_model_len,
        prefill_chunk_tokens=config.server.prefill_chunk_tokens,
        num_speculative_tokens=plan.speculation.max_k if proposer != "none" else 0,
        adaptive=speculation.adaptive,
        proposer=proposer,
        draft_dir=draft_dir,
        drafter_actor=f"{prefix}.drafter" if remote_drafter else None,
        mode=speculation.mode,
        num_threads=threads,
        tensor_parallel_size=verifier.tensor_parallel_size,
        layers=(verifier.layer_start, verifier.layer_end) if stages else None,
        pipeline_stages=[stage.actor for stage in stages],
    )
    if proposer == "draft_model":  # the colocated draft's proposals (a remote one: its shard's)
        spec.sparse_top_k = speculation.proposal_tokens
        spec.sparse_mass = speculation.proposal_mass
        spec.sparse_max_listed = speculation.proposal_max_tokens
    # the verifier's chooser asks for coupled drafts now and then: only of lists (a remote
    # drafter's width stays its shard's, so that changing it redeploys the drafter alone)
    spec.choose_proposal = speculation.choose_proposal and speculation.proposal_tokens > 0
    loaded = asdict(spec)
    live = {k: loaded.pop(k) for k in ("num_speculative_tokens", "adaptive")}
    # a replaced stage is a new actor: the verifier holding the old one is replaced with it
    loaded["stage_fingerprints"] = [stage.fingerprint for stage in stages]
    fingerprint = _fingerprint({"node": verifier.node, **loaded})
    return DesiredShard(
        f"{prefix}.verifier",
        "verifier",
        verifier.replica,
        verifier.node,
        spec,
        fingerprint,
        json.dumps(live, sort_keys=True),
    )


@dataclass(slots=True)
class Deployed:
    started: list[str]  # actors (re)started (waited for until loaded)
    changed_live: list[str]  # "<actor> speculation k=..": running shards changed in place


def deploy_shards(
    desired: list[DesiredShard],
    previous: list[ShardState],
    events: ApplyEvents,
    load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
    lost_nodes: frozenset[str] = frozenset(),
    preflight: bool = True,
) -> Deployed:
    """Make the cluster run `desired`: what was (re)started and what was changed live.
    A shard on one of `lost_nodes` (Ray there had died and was started again) is replaced,
    not kept: Ray restarts its actor on the new node only once its health checks mark the
    old one dead, and one found then "ready" went down again to restart after apply.
    `preflight` False: no model is checked before a running shard is replaced (a rollback:
    what runs is what failed)."""
    before = {s.actor: s for s in previous}
    # a verifier finds its pipeline stages once, at load: one whose stage is replaced (its
    # node restarted) is replaced with it, or it calls the dead stage's handle forever
    lost_stages = {d.replica for d in desired if d.role == "stage" and d.node in lost_nodes}
    lost = {
        d.actor
        for d in desired
        if d.node in lost_nodes or (d.role == "verifier" and d.replica in lost_stages)
    }
    handles_now = {d.actor: find_actor(d.actor) for d in desired}
    # a shard on a restarted node is not asked (Ray has yet to mark it dead: a call there may
    # wait out its timeout); it is replaced whatever it says
    up = _up({a: h for a, h in handles_now.items() if a not in lost and h is not None})
    kept = {
        d.actor
        for d in desired
        if d.actor in up
        and (old := before.get(d.actor)) is not None
        and old.fingerprint == d.fingerprint
    }
    # before anything stops: a running shard is replaced only where every shard this apply
    # starts would load (preflight.py)
    if preflight:
        check_before_replacing(
            [d for d in desired if d.actor in up and d.actor not in kept],
            [d for d in desired if d.actor not in kept],
            events,
        )
    touched: set[str] = set()
    try:
        return _deploy(desired, before, handles_now, kept, lost, lost_nodes, events,
                       load_timeout_s, touched)  # fmt: skip
    except Exception as exc:
        if not touched:
            raise
        raise ReplacementFailed(said(exc), touched) from exc


def said(exc: BaseException) -> str:
    """An error as apply says it: ours whole (they are written to be read), anything else on
    one line (a Ray actor error's text is a traceback)."""
    if isinstance(exc, ShardError | ClusterUpError | ConfigError) and str(exc).strip():
        return str(exc).strip()
    return first_line(exc)


def _deploy(
    desired: list[DesiredShard],
    before: dict[str, ShardState],
    handles_now: dict[str, Any],
    kept: set[str],
    lost: set[str],
    lost_nodes: frozenset[str],
    events: ApplyEvents,
    load_timeout_s: float,
    touched: set[str],
) -> Deployed:
    """deploy_shards after its checks: `touched` gathers the shards it changes, as it goes."""
    for gone in before.keys() - {d.actor for d in desired}:
        touched.add(gone)
        kill_actor(gone)
        events.step(f"remove {gone}", "done")
    started: list[str] = []
    changed_live: list[str] = []
    handles: dict[str, Any] = {}  # the started ones' own (by name: a killed one's may answer)
    for shard in desired:
        name = shard.step_name
        handle = handles_now[shard.actor]
        if shard.actor in kept:
            touched.add(shard.actor)  # (its speculation may change live)
            if changed := _keep(shard, before[shard.actor], handle, events):
                changed_live.append(changed)
            else:
                touched.discard(shard.actor)
            continue
        touched.add(shard.actor)
        if handle is not None:
            kill_actor(shard.actor)
        why = ""
        if shard.node in lost_nodes:
            why = " (its Ray restarted)"
        elif shard.actor in lost:
            why = " (a pipeline stage's Ray restarted)"
        events.step(name, "started", f"on {shard.node}{why}")
        tp = getattr(shard.spec, "tensor_parallel_size", 1)
        # Ray does not restart a tensor-parallel shard (rank 0 could not gather its group
        # again) nor a pipeline stage (its KV cache empty, it could not serve the verifier's
        # sequences): the verifier fails their requests, the next apply replaces them
        restarts = {"drafter": DRAFTER_RESTARTS, "verifier": VERIFIER_RESTARTS}.get(shard.role, 0)
        placement = Placement(shard.node, max_restarts=restarts if tp == 1 else 0)
        if isinstance(shard.spec, VerifierSpec):
            handle = create_verifier(shard.actor, shard.spec, placement)
        elif isinstance(shard.spec, StageSpec):
            handle = create_stage(shard.actor, shard.spec, placement)
        else:
            handle = create_drafter(shard.actor, shard.spec, placement)
        if tp > 1:
            start_ranks(shard.actor, handle, _rank_template(shard.spec), placement)
            events.step(name, "started", f"{tp} tensor-parallel ranks on {shard.node}")
        started.append(shard.actor)
        handles[shard.actor] = handle
    # the shards kept are waited for too: one Ray restarts (its node died) is kept while it
    # loads again, and apply said done while it could serve nothing yet
    wait_loaded(desired, events, load_timeout_s, announce=set(started), handles=handles)
    return Deployed(started, changed_live)


def _rank_template(spec: VerifierSpec | DrafterSpec) -> RankSpec:
    model_dir = spec.target_dir if isinstance(spec, VerifierSpec) else spec.draft_dir
    assert model_dir is not None  # an n-gram drafter has no model to split (config refuses it)
    return RankSpec(
        model_dir,
        rank=0,
        size=spec.tensor_parallel_size,
        address="",  # rank 0's, asked when the ranks start
        num_slots=spec.max_batch_size,
        max_model_len=spec.max_model_len,
        dtype=spec.dtype,
        timeout_s=spec.tp_timeout_s,
        num_threads=spec.num_threads,
    )


def _keep(shard: DesiredShard, old: ShardState, handle: Any, events: ApplyEvents) -> str:
    """Keep a running shard started with the same fingerprint, changing its speculation
    settings live if only they differ: "" (kept as it was) or what was changed live
    ("<actor> speculation k=2, adaptive off")."""
    import ray

    name = shard.step_name
    # a verifier Ray restarted (its process died) runs the settings it was created with, not
    # those changed live since: what it runs now is compared too (it said "already running"
    # and went on drafting the old k)
    restarted = shard.role == "verifier" and _running_speculation(handle) not in (
        None,
        shard.speculation,
    )
    if shard.role == "verifier" and (old.speculation != shard.speculation or restarted):
        live = json.loads(shard.speculation)
        k, adaptive = live["num_speculative_tokens"], live["adaptive"]
        call = handle.set_speculation.remote(k, adaptive)
        ray.get(call, timeout=STATUS_TIMEOUT_S + 60)
        how = "changed" if old.speculation != shard.speculation else "restored"
        events.step(name, "done", f"speculation {how} live: {shard.speculation}")
        return f"{shard.actor} speculation k={k}, adaptive {'on' if adaptive else 'off'}"
    events.step(name, "skipped", f"already running on {shard.node}")
    return ""


def _running_speculation(handle: Any) -> str | None:
    """The speculation settings a verifier runs now, as DesiredShard.speculation spells them
    (None: it could not say, e.g. still loading)."""
    import ray

    try:
        info = ray.get(handle.info.remote(), timeout=STATUS_TIMEOUT_S)
    except Exception:
        return None
    live = {"num_speculative_tokens": info.num_speculative_tokens, "adaptive": info.adaptive}
    return json.dumps(live, sort_keys=True)


def _up(handles: dict[str, Any]) -> set[str]:
    """The shards that answer "ready" or "loading" (all asked at once)."""
    answers = ask_statuses(handles, STATUS_TIMEOUT_S)
    return {
        actor
        for actor, status in answers.items()
        if isinstance(status, ShardStatus) and status.state in ("ready", "loading")
    }


def wait_loaded(
    shards: list[DesiredShard],
    events: ApplyEvents,
    timeout_s: float,
    announce: set[str] | None = None,
    handles: dict[str, Any] | None = None,
) -> None:
    """Poll each shard's status until every one is ready; report loading progress. Of the
    shards not in `announce` (all when None), only those found not ready are reported.
    `handles`: the actors to ask, by name (else looked up by name: a name killed a moment
    ago may still lead to the old actor, which answered "ready" for the new one)."""
    handles = handles or {}
    pending = {s.actor: s for s in shards}
    quiet = set() if announce is None else pending.keys() - announce
    deadline = time.monotonic() + timeout_s
    while pending:
        if time.monotonic() > deadline:
            names = ", ".join(sorted(pending))
            raise ShardError(f"shards not ready after {timeout_s:g} s: {names}")
        for actor, shard in list(pending.items()):
            status = _status(actor, handles.get(actor))
            if status is None:
                quiet.discard(actor)
                continue  # still being placed (or its node is not up yet)
            if actor in quiet and status.state == "ready":
                del pending[actor]
                continue
            quiet.discard(actor)
            events.loading(actor, status.node_name, status.loaded_bytes, status.total_bytes)
            if status.state == "ready":
                events.step(
                    shard.step_name,
                    "done",
                    f"loaded on {status.node_name} in {status.load_time_s:.1f} s",
                )
                del pending[actor]
            elif status.state == "failed":
                events.step(shard.step_name, "failed", status.error or "failed to load")
                raise ShardError(f"{actor} on {shard.node} failed to load: {status.error}")
        if pending:
            time.sleep(LOAD_POLL_S)


def _status(actor: str, handle: Any | None = None) -> ShardStatus | None:
    import ray

    handle = handle if handle is not None else find_actor(actor)
    if handle is None:
        return None
    try:
        return ray.get(handle.status.remote(), timeout=LOAD_POLL_S * 4)
    except Exception:
        return None
