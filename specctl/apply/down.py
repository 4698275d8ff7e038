"""`specctl down`: stop everything `apply` started — the watch, the serving process, the
shards, the Ray nodes — and leave no process behind."""

import contextlib
import logging
import shutil
from pathlib import Path

from db import Store
from db.errors import StoreError
from specctl.apply.cluster_up import take_down_nodes
from specctl.apply.events import ApplyEvents
from specctl.apply.home_lock import home_lock
from specctl.apply.state import AppliedState, StateError
from specctl.apply.watch_record import STOP_WAIT_S, stop_watch
from specctl.cluster.local_cluster import LocalCluster
from specctl.cluster.local_nodes import LocalNodeSpec
from specctl.deploy.actors import kill_actor
from specctl.deploy.ray_connect import RayConnectError, connect, disconnect
from specctl.deploy.server_process import ServerRecord, ServerRecordError, stop_server
from specctl.home import SpecctlHome

logger = logging.getLogger(__name__)


class WatchNotStopped(Exception):
    """The deployment is down, but the home's watch would not stop; the message says why
    and what is left."""


def take_down(
    home: SpecctlHome, events: ApplyEvents, watch_wait_s: float = STOP_WAIT_S
) -> list[int]:
    """Stop the deployment recorded under `home`; returns pids that would not die (empty:
    clean). Safe to run twice, and after a partial apply. The home's watch is stopped first:
    left running, it would keep an apply made after this down. It stops at once, or once an
    apply it has under way is done (a repair, or its first apply; up to `watch_wait_s` is
    waited for that). HomeBusyError while an apply or another down runs on the same home,
    a repair by a watch that did not stop in time included (a down once it is done takes the
    deployment down). WatchNotStopped, once all else is down, where the watch would not stop
    (another user's, or its record unreadable)."""
    stopping = stop_watch(home, watch_wait_s)
    if stopping.pid is not None or not stopping.stopped:  # a down with none says nothing of it
        events.step("watch", "done" if stopping.stopped else "failed", stopping.message)
    with home_lock(home, "down"):
        leftover = take_down_unlocked(home, events)
    if not stopping.stopped:
        rest = (
            f"processes still alive after down: {leftover}"
            if leftover
            else "everything else apply started is stopped"
        )
        raise WatchNotStopped(f"the watch would not stop ({stopping.message}); {rest}")
    return leftover


def take_down_unlocked(home: SpecctlHome, events: ApplyEvents) -> list[int]:
    """take_down, for a caller that holds the home's lock (apply, rolling back)."""
    leftover: list[int] = []
    try:
        record = ServerRecord.load(home.server_file)
    except ServerRecordError as exc:  # the server may still run: nothing is taken down
        events.step("server", "failed", str(exc))
        raise
    if record is not None and record.is_alive():
        events.step("server", "started", f"stopping pid {record.pid}")
        leftover += stop_server(record)
        events.step("server", "done")
    home.server_file.unlink(missing_ok=True)
    state = AppliedState.load(home.state_file)
    if state is None:
        events.step("deployment", "skipped", "nothing applied")
        return leftover
    if state.local_root and not _is_ray_root(home, Path(state.local_root)):
        raise StateError(
            f"{home.state_file}: local_root {state.local_root!r} is not this home's directory "
            f"for local Ray nodes ({home.ray_root}); state.json may be another home's"
        )
    _kill_shards(state, events)
    events.step("ray nodes", "started", f"{len(state.nodes)} node(s)")
    local = None
    if state.local_root and state.local_nodes:
        specs = [LocalNodeSpec(name) for name in state.local_nodes]
        local = LocalCluster(specs, Path(state.local_root), Path(state.token_file))
    leftover += take_down_nodes(state.nodes, local)
    if state.local_root and not leftover:  # Ray's logs and sockets of nodes now gone
        shutil.rmtree(state.local_root, ignore_errors=True)
    events.step("ray nodes", "done" if not leftover else "failed", _survivors(leftover))
    if _mark_stopped(home, state):  # else kept: `down` again records it (the rest is done)
        home.state_file.unlink(missing_ok=True)
    return leftover


def _is_ray_root(home: SpecctlHome, path: Path) -> bool:
    """Whether `path` is this home's directory for local Ray nodes: the only one `down`
    deletes (a state.json naming another directory had it deleted)."""
    return path.resolve() == home.ray_root.resolve()


def _kill_shards(state: AppliedState, events: ApplyEvents) -> None:
    """Kill the shard actors for good (no restart) while the cluster still answers."""
    events.step("shards", "started", f"{len(state.shards)} shard(s)")
    try:
        connect(state.ray_address, Path(state.token_file))
    except RayConnectError as exc:
        events.step("shards", "skipped", f"cluster unreachable ({exc}); stopping nodes")
        return
    try:
        for shard in state.shards:
            with contextlib.suppress(Exception):
                kill_actor(shard.actor)
    finally:
        disconnect()
    events.step("shards", "done")


def _mark_stopped(home: SpecctlHome, state: AppliedState) -> bool:
    """Record the deployment as stopped, in the store apply recorded it in (status and the
    serving process read state.db_path too); False where the store would not (busy, damaged)."""
    if not state.deployment_id:
        return True
    try:
        with Store.open(state.db_path or home.db_file, role="writer") as store:
            store.set_deployment_status(state.deployment_id, "stopped")
    except StoreError as exc:
        logger.warning(
            "could not record the deployment as stopped: %s; its processes are stopped, and "
            "`specctl down` again records it (%s is kept until then)",
            exc,
            home.state_file,
        )
        return False
    return True


def _survivors(pids: list[int]) -> str:
    return f"processes still alive: {pids}" if pids else "no process left"
