"""`specctl apply cluster.toml`: validate, plan, bring the cluster and the shards to what the
file asks, start (or keep) the serving process, wait until it answers, record it.

Applying the same file twice changes nothing: nodes already running are found running, shards
with the same fingerprint are kept, a serving process with the same fingerprint is kept. A
changed file changes only what changed (a new k is applied to the running verifier; a drafter
moved to another node is replaced alone).
"""

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NoReturn

from db import DeploymentRow, Store
from specctl.apply.cluster_up import ClusterUp, bring_up, retire_nodes
from specctl.apply.down import take_down_unlocked
from specctl.apply.events import ApplyEvents
from specctl.apply.home_lock import home_lock
from specctl.apply.rollback import roll_back
from specctl.apply.server_up import check_server_address, ensure_server
from specctl.apply.shards import (
    DesiredShard,
    ReplacementFailed,
    deploy_shards,
    desired_shards,
)
from specctl.apply.state import AppliedState, ServerState
from specctl.config.cluster import ClusterConfig
from specctl.config.errors import ConfigError
from specctl.config.loader import load_config_text, read_config_text
from specctl.deploy.live_nodes import wait_one_live_node_each
from specctl.deploy.ray_connect import connect, disconnect
from specctl.deploy.server_process import ServerRecord
from specctl.home import SpecctlHome
from specctl.planner.deployable import not_deployable
from specctl.planner.gather import gather_node_facts
from specctl.planner.placement import make_plan
from specctl.planner.plan import Plan


class ApplyError(Exception):
    """The deployment cannot be applied as written; the message says why and what to do."""


@dataclass(slots=True)
class ApplyOptions:
    load_timeout_s: float = 900.0  # every shard loaded within this
    health_timeout_s: float = 120.0  # the serving process answers /health within this
    shard_threads: int | None = 1  # torch threads per shard process (None: torch's default)


@dataclass(slots=True)
class ApplyResult:
    endpoint: str  # http://host:port/v1
    plan: Plan
    changed: list[str] = field(default_factory=list)  # steps that did something
    deployment_id: int = 0


def apply_deployment(
    config_path: Path,
    home: SpecctlHome,
    events: ApplyEvents,
    options: ApplyOptions | None = None,
    as_applied: str | None = None,
) -> ApplyResult:
    """`as_applied`: apply again what was applied, this text (state.json's) as the file at
    `config_path` (its relative paths start there), not what the file holds now; refused
    (AppliedSince) where, by the time the lock is held, the deployment was taken down or
    applied anew (the watch's repairs)."""
    opts = options or ApplyOptions()
    text = read_config_text(config_path) if as_applied is None else as_applied
    config, plan = _validate_and_plan(config_path, events, text, as_applied is not None)
    ServerRecord.load(home.server_file)  # a record that cannot be trusted: before anything runs
    home.ensure()  # after the checks: a file refused leaves nothing behind
    with home_lock(home, "apply"):  # one apply or down at a time (home_lock.py)
        if as_applied is not None:
            _check_still_applied(home, as_applied)
        return _apply_locked(config_path, text, config, plan, home, events, opts)


class AppliedSince(ApplyError):
    """What a repair was to apply again is no longer what is applied (down, or applied anew)."""


def _check_still_applied(home: SpecctlHome, text: str) -> None:
    now = AppliedState.load(home.state_file)
    if now is None:
        raise AppliedSince("nothing is applied any more (`specctl down`)")
    if now.config_text != text:
        raise AppliedSince(f"{now.config_path} was applied anew meanwhile")


def _apply_locked(
    config_path: Path,
    config_text: str,
    config: ClusterConfig,
    plan: Plan,
    home: SpecctlHome,
    events: ApplyEvents,
    opts: ApplyOptions,
) -> ApplyResult:
    previous = AppliedState.load(home.state_file)
    if previous is not None and previous.deployment != plan.deployment:
        raise ApplyError(
            f"deployment {previous.deployment!r} is up (from {previous.config_path}); "
            f"run `specctl down` before applying {plan.deployment!r}"
        )
    desired = desired_shards(config, plan, opts.shard_threads)
    check_server_address(home, config.server.host, config.server.port)  # before any change
    if previous is not None and previous.nodes and previous.nodes[0].name != config.nodes[0].name:
        raise ApplyError(
            f"the head node changed ({previous.nodes[0].name} -> {config.nodes[0].name}); the "
            "first node of the file is the Ray head: run `specctl down`, then apply"
        )
    cluster = bring_up(config, home, events)
    if previous is None:  # record what runs now, so that `down` finds it if a shard fails
        _partial_state(config_path, config, plan, cluster, desired).save(home.state_file)
    try:
        connect(cluster.address, cluster.token_file)
        try:
            wait_one_live_node_each([n.name for n in config.nodes], on_wait=_said_wait(events))
            events.step("shards", "started", f"{len(desired)} shard(s)")
            # nodes of the deployment that had to be started again: their shards died there
            lost = (
                frozenset(cluster.started) & {n.name for n in previous.nodes}
                if previous
                else frozenset()
            )
            try:
                deployed = deploy_shards(
                    desired,
                    previous.shards if previous else [],
                    events,
                    opts.load_timeout_s,
                    lost_nodes=lost,
                )
            except ReplacementFailed as failed:
                if previous is None or not previous.config_text:
                    raise
                _put_back(home, previous, failed, desired, cluster, events, opts, lost)
            started = deployed.started
            events.step("shards", "done", f"{len(started)} (re)started")
        finally:
            disconnect()
        if previous is not None:
            retired = retire_nodes(previous.nodes, cluster.nodes, home.ray_root, cluster.token_file)
            if retired:
                events.step(
                    "ray nodes", "done", f"stopped nodes no longer listed: {', '.join(retired)}"
                )
                started.extend(f"node {name} stopped" for name in retired)
        state = replace(
            _partial_state(config_path, config, plan, cluster, desired),
            config_text=config_text,
            server=_server_state(config, desired),
            db_path=str(home.db_file),
            deployment_id=previous.deployment_id if previous else 0,
        )
        changed = bool(started) or previous is None or _changed(previous, state)
        # a new history row where a new serving process will write it: one that keeps running
        # (a k changed live, a comment edited) writes under the id it started with, and status
        # read the new one and found no samples
        restarts_server = previous is None or previous.server != state.server
        if (changed and restarts_server) or state.deployment_id == 0:
            state.deployment_id = _record(home, state, plan)
        state.save(home.state_file)
        new_head = previous is not None and config.nodes[0].name in cluster.started
        server_changed = ensure_server(
            home, state, events, opts.health_timeout_s, new_cluster=new_head
        )
    except Exception as exc:
        if previous is not None:  # what ran before keeps running: `status` tells what failed
            raise
        # a first apply that failed: nothing of it is left running (a bad model path left two
        # Ray nodes, a loaded drafter and a failed verifier, and a status saying to apply again)
        events.step("rollback", "started", "stopping what this first apply started")
        leftover = take_down_unlocked(home, events)
        events.step("rollback", "done" if not leftover else "failed")
        raise ApplyError(
            f"{str(exc).strip() or type(exc).__name__} (this first apply's nodes, shards and "
            "server were stopped again)"
        ) from exc
    steps = [*started, *deployed.changed_live, *(["server"] if server_changed else [])]
    return ApplyResult(f"{state.server.url}/v1", plan, steps, state.deployment_id)  # type: ignore[union-attr]


def _put_back(
    home: SpecctlHome,
    last_good: AppliedState,
    failed: ReplacementFailed,
    desired: list[DesiredShard],
    cluster: ClusterUp,
    events: ApplyEvents,
    opts: ApplyOptions,
    lost: frozenset[str],
) -> NoReturn:
    """After `failed`: what the last good apply ran runs again (rollback.py), and the apply
    fails saying so."""
    why = roll_back(
        home,
        last_good,
        failed,
        desired,
        cluster,
        events,
        shard_threads=opts.shard_threads,
        load_timeout_s=opts.load_timeout_s,
        health_timeout_s=opts.health_timeout_s,
        lost_nodes=lost,
    )
    if why:
        raise ApplyError(
            f"{failed}; putting back what the last good apply ran ({last_good.config_path}) "
            f"failed too: {why}; `specctl status` says what runs: apply that file again once "
            "this is fixed, or `specctl down`"
        ) from failed
    raise ApplyError(
        f"{failed}; the shards of the last good apply ({last_good.config_path}) were started "
        "again and serve: fix the file and apply it again"
    ) from failed


def _said_wait(events: ApplyEvents) -> Callable[[dict[str, int]], None]:
    def said(counts: dict[str, int]) -> None:
        listed = ", ".join(f"{name} {n}x" for name, n in sorted(counts.items()) if n != 1)
        events.step("ray nodes", "started", f"waiting for Ray to list each node once ({listed})")

    return said


def _partial_state(
    config_path: Path,
    config: ClusterConfig,
    plan: Plan,
    cluster: ClusterUp,
    desired: list[DesiredShard],
) -> AppliedState:
    return AppliedState(
        deployment=plan.deployment,
        config_path=str(config_path.resolve()),
        config_text="",  # not applied yet: a second apply compares nothing with it
        plan_json=plan.model_dump_json(),
        served_model_name=config.deployment.verifier.model,
        ray_address=cluster.address,
        token_file=str(cluster.token_file),
        local_root=str(cluster.local_root) if cluster.local_root else None,
        local_nodes=cluster.local_nodes,
        nodes=cluster.nodes,
        shards=[d.state() for d in desired],
    )


def _validate_and_plan(
    config_path: Path, events: ApplyEvents, text: str, as_applied: bool = False
) -> tuple[ClusterConfig, Plan]:
    """`text`: the file's, read once (what is applied is what was checked); `as_applied`:
    state.json's, errors naming the file "(as applied)"."""
    events.step("validate", "started", str(config_path))
    shown = f"{config_path} (as applied)" if as_applied else str(config_path)
    try:  # ConfigError names file:line: field
        config = load_config_text(text, config_path, shown)
    except ConfigError as error:
        problems = f"{len(error.issues)} problem(s) in the file"
        if error.unreachable:
            problems = "the nodes that keep a model did not answer: it could not be checked"
        events.step("validate", "failed", problems)
        raise
    events.step("validate", "done")
    events.step("plan", "started")
    plan = make_plan(config, gather_node_facts(config, mode="probe"))
    if plan.verdict == "does_not_fit":
        events.step("plan", "failed", "; ".join(plan.problems))
        raise ApplyError("the plan does not fit:\n  " + "\n  ".join(plan.problems))
    if reasons := not_deployable(plan.shards):
        events.step("plan", "failed", "; ".join(reasons))
        raise ApplyError("the plan fits, but cannot be deployed yet:\n  " + "\n  ".join(reasons))
    events.step("plan", "done", plan.verdict)
    return config, plan


def _server_state(config: ClusterConfig, desired: list[DesiredShard]) -> ServerState:
    server = config.server
    api_key = config.api_key_path()
    verifiers = sorted((d.actor, d.fingerprint) for d in desired if d.role == "verifier")
    fingerprint = hashlib.sha256(
        json.dumps(
            [server.host, server.port, str(api_key), server.max_batch_size, verifiers]
        ).encode()
    ).hexdigest()[:16]
    return ServerState(
        server.host,
        server.port,
        str(api_key) if api_key else None,
        server.max_batch_size,
        fingerprint,
    )


def _changed(previous: AppliedState, state: AppliedState) -> bool:
    return (
        previous.config_text != state.config_text
        or [s.speculation for s in previous.shards] != [s.speculation for s in state.shards]
        or previous.server != state.server
    )


def _record(home: SpecctlHome, state: AppliedState, plan: Plan) -> int:
    with Store.open(home.db_file, role="writer") as store:
        return store.add_deployment(
            DeploymentRow(
                name=state.deployment,
                config_path=state.config_path,
                config_text=state.config_text,
                plan_json=state.plan_json,
                applied_unix_s=time.time(),
                status="running",
                endpoint=f"{state.server.url}/v1" if state.server else plan.endpoint,
            )
        )
