"""Putting back what served before an apply whose new shards failed to load.

The preflight (preflight.py) reads each new model's config and safetensors headers on its
node before a running shard is stopped, but some failures only a load finds: too little
memory, a file changed between the check and the load, a node's disk failing mid-read. Such
an apply has already stopped the shards it was replacing, and before this module it left no
endpoint: `status` said what failed and the operator had to find the last good file and apply
it again. Now the apply does that itself. The state file still holds what the last successful
apply ran (it is written only once everything loads): its file text and plan make the shards
it ran again, which are deployed like any apply's, over what the failed one left (its shards
kept as they were where it had not touched them, its new ones removed). The serving process
was never restarted (that comes after the shards): it finds the verifier again by name.
Nodes the failed apply started that the last good one did not list are stopped.
"""

from pathlib import Path

from specctl.apply.cluster_up import ClusterUp, retire_nodes
from specctl.apply.events import ApplyEvents
from specctl.apply.shards import DesiredShard, ReplacementFailed, deploy_shards, desired_shards
from specctl.apply.state import AppliedState
from specctl.config.loader import load_config_text
from specctl.deploy.actors import first_line
from specctl.planner.plan import Plan

STEP = "rollback"


def roll_back(
    last_good: AppliedState,
    failed: ReplacementFailed,
    attempted: list[DesiredShard],
    cluster: ClusterUp,
    events: ApplyEvents,
    shard_threads: int | None,
    load_timeout_s: float,
) -> str:
    """Run again the shards `last_good` ran, after `failed` changed those in
    `failed.touched` (as `attempted` asked); "" when they serve, else why not."""
    source = Path(last_good.config_path)
    events.step(STEP, "started", f"starting again the shards of the last good apply ({source})")
    try:
        config = load_config_text(last_good.config_text, source_path=source)
        plan = Plan.model_validate_json(last_good.plan_json)
        shards = desired_shards(config, plan, shard_threads)
        # what runs now: the last good shards, except where the failed apply changed them
        now = {s.actor: s for s in last_good.shards}
        now.update((d.actor, d.state()) for d in attempted if d.actor in failed.touched)
        deployed = deploy_shards(shards, list(now.values()), events, load_timeout_s)
        listed = {n.name for n in last_good.nodes}
        extra = [n for n in cluster.nodes if n.name in cluster.started and n.name not in listed]
        retire_nodes(extra, [], cluster.local_root, cluster.token_file)
    except Exception as exc:
        why = str(exc).strip() or first_line(exc)
        events.step(STEP, "failed", why)
        return why
    detail = f"{len(deployed.started)} shard(s) started again"
    if extra:
        detail += f"; stopped the nodes it had started: {', '.join(n.name for n in extra)}"
    events.step(STEP, "done", detail)
    return ""
