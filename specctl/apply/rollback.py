"""Putting back what served before an apply whose new shards failed to load.

The preflight (preflight.py) reads each new model's config and safetensors headers on its
node before a running shard is stopped, but some failures only a load finds: too little
memory, a file changed between the check and the load, a node's disk failing mid-read. Such
an apply has already stopped the shards it was replacing, and before this module it left no
endpoint: `status` said what failed and the operator had to find the last good file and apply
it again. Now the apply does that itself. The state file still holds what the last successful
apply ran (it is written only once everything loads): its file text and plan make the shards
it ran again (no model is read for that: the plan has their paths), which are deployed like
any apply's over what the failed one left (its shards kept as they were where it had not
touched them, its new ones removed), without the preflight (what runs is what failed). Nodes
the failed apply added are stopped, whatever the redeploy did. Then the serving process is
checked as an apply checks it: kept where it serves, replaced where the head was started
again (it held the old GCS's handles).
"""

from dataclasses import replace
from pathlib import Path

from specctl.apply.cluster_up import ClusterUp, retire_nodes
from specctl.apply.events import ApplyEvents
from specctl.apply.server_up import ensure_server
from specctl.apply.shards import (
    DesiredShard,
    ReplacementFailed,
    deploy_shards,
    desired_shards,
    said,
)
from specctl.apply.state import AppliedState
from specctl.config.loader import load_config_text
from specctl.home import SpecctlHome
from specctl.planner.plan import Plan

STEP = "rollback"


def roll_back(
    home: SpecctlHome,
    last_good: AppliedState,
    failed: ReplacementFailed,
    attempted: list[DesiredShard],
    cluster: ClusterUp,
    events: ApplyEvents,
    *,
    shard_threads: int | None,
    load_timeout_s: float,
    health_timeout_s: float,
    lost_nodes: frozenset[str],
) -> str:
    """Run again what `last_good` ran, after `failed` changed the shards in `failed.touched`
    (as `attempted` asked); "" when it serves, else why not."""
    source = Path(last_good.config_path)
    events.step(STEP, "started", f"starting again the shards of the last good apply ({source})")
    stopped: list[str] = []
    try:
        try:
            config = load_config_text(
                last_good.config_text, source, f"{source} (as last applied)", read_models=False
            )
            shards = desired_shards(config, Plan.model_validate_json(last_good.plan_json),
                                    shard_threads)  # fmt: skip
            # what runs now: the last good shards, except where the failed apply changed them
            now = {s.actor: s for s in last_good.shards}
            now.update((d.actor, d.state()) for d in attempted if d.actor in failed.touched)
            deploy_shards(shards, list(now.values()), events, load_timeout_s,
                          lost_nodes=lost_nodes, preflight=False)  # fmt: skip
        finally:  # a node the last good apply did not list would be listed nowhere
            listed = {n.name for n in last_good.nodes}
            extra = [n for n in cluster.nodes if n.name not in listed]
            stopped = retire_nodes(extra, [], cluster.local_root, cluster.token_file)
        restored = replace(last_good, ray_address=cluster.address)
        if restored != last_good:  # the head was started again: the server reads its address
            restored.save(home.state_file)
        head = last_good.nodes[0].name if last_good.nodes else None
        ensure_server(home, restored, events, health_timeout_s, new_cluster=head in cluster.started)
    except Exception as exc:
        why = said(exc)
        events.step(STEP, "failed", why)
        return why
    detail = "the last good shards serve again"
    if stopped:
        detail += f"; stopped the nodes the failed apply had added: {', '.join(stopped)}"
    events.step(STEP, "done", detail)
    return ""
