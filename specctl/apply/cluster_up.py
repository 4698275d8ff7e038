"""Bring the Ray cluster of a cluster.toml up (or find it up), and take it down.

The first node of the file is the head. `local` nodes are Ray nodes on this machine
(`specctl/cluster/`); the others are asked through their specd (`POST /v1/ray/start` with the
cluster token). Every node is labelled `specctl.io/node=<its name in the file>`: shards are
placed by that label. Starting a node that already runs as asked is a no-op on both paths.
"""

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from daemon.cluster_token import TokenError, generate_token, read_token, write_token
from daemon.shard.node_context import NODE_LABEL
from daemon.specd.address import is_loopback, parse_address
from specctl.apply.events import ApplyEvents
from specctl.apply.state import NodeState
from specctl.cluster.local_cluster import LocalCluster
from specctl.cluster.local_nodes import LocalClusterError, LocalNodeSpec
from specctl.cluster.ports import reserve
from specctl.config.cluster import ClusterConfig
from specctl.config.schema import NodeSpec
from specctl.home import SpecctlHome
from specctl.planner.gather import different_tokens, read_node_tokens

SPECD_TIMEOUT_S = 180.0  # a specd's `ray start` may take a while on a slow machine
# ...but its /health answers at once (on its event loop, never behind a busy thread pool): one
# that does not is hung or not a specd, and is said so within this, not after SPECD_TIMEOUT_S
SPECD_ANSWER_TIMEOUT_S = 10.0
SPECD_BUSY_WAIT_S = 120.0  # a stop waits this long for a specd busy with a start
SPECD_BUSY_POLL_S = 1.0
HTTP_CONFLICT = 409
LOCAL_NODE_CPUS = 1


class ClusterUpError(Exception):
    """A node could not be started or reached; the message names it and says why. `status`:
    the specd's HTTP status, where one answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class ClusterUp:
    address: str  # host:port of the head's GCS
    token_file: Path
    local_root: Path | None
    local_nodes: list[str]
    nodes: list[NodeState]
    started: list[str] = field(default_factory=list)  # nodes this call (re)started


def cluster_token(config: ClusterConfig, home: SpecctlHome) -> Path:
    """The cluster token: the specd nodes' (all must hold the same), else one under the home,
    made on first use."""
    remote = [n for n in config.nodes if not n.is_local]
    if not remote:
        path = home.token_file
        if not path.exists():
            write_token(path, generate_token(), force=False)
        return path
    tokens, problems = read_node_tokens(config)
    if problems:
        raise ClusterUpError(problems[0])
    if mixed := different_tokens(tokens):
        raise ClusterUpError(mixed)
    return next(iter(tokens.values()))


def local_cluster(
    config: ClusterConfig, home: SpecctlHome, token_file: Path
) -> LocalCluster | None:
    specs = [
        LocalNodeSpec(n.name, labels=dict(n.labels), num_cpus=LOCAL_NODE_CPUS)
        for n in config.nodes
        if n.is_local
    ]
    # the endpoint binds its port only after the cluster is up: the nodes' ports (chosen now)
    # must not take it (one test run's `serve` failed with "Address already in use")
    reserve(config.server.port)
    return LocalCluster(specs, home.ray_root, token_file) if specs else None


def bring_up(config: ClusterConfig, home: SpecctlHome, events: ApplyEvents) -> ClusterUp:
    """Start every node of the file not running yet. Where one fails, the nodes this call
    started are stopped again before the error goes up: no deployment is recorded for them
    yet (apply records one once the cluster is up), so `specctl down` could not find them,
    and a fresh apply whose second node was unreachable left the head's Ray running. Nodes
    found running are left as they were: they belong to the deployment already applied."""
    events.step("ray nodes", "started", f"{len(config.nodes)} node(s)")
    token_file = cluster_token(config, home)
    local = local_cluster(config, home, token_file)
    running_before = {n.spec.name for n in local.nodes if n.running is not None} if local else set()
    started: list[NodeSpec] = []  # specd nodes this call started, in order
    head = config.nodes[0]
    try:
        if head.is_local:
            assert local is not None
            address = local.start()
        else:
            address = _specd_start(config, head, token_file, None, started)
            if local is not None:
                try:
                    local.start(address, fresh_head=head in started)
                except LocalClusterError as exc:
                    hint = loopback_hint(config, "the local nodes", address)
                    raise LocalClusterError(f"{exc}{hint}") from None
        fresh_head = head in started or (head.is_local and head.name not in running_before)
        for node in config.nodes[1:]:
            if not node.is_local:
                try:
                    _specd_start(config, node, token_file, address, started, fresh_head)
                except ClusterUpError as exc:
                    hint = loopback_hint(config, node.name, address)
                    raise ClusterUpError(f"{exc}{hint}", exc.status) from None
    except (LocalClusterError, ClusterUpError) as exc:
        message = str(exc)
        leftover = _undo_start(started, local, running_before, token_file)
        if leftover:
            message += f"; pids {', '.join(map(str, leftover))} of the nodes it started survived"
        events.step("ray nodes", "failed", message)
        raise ClusterUpError(message) from None
    events.step("ray nodes", "done", f"head {head.name} at {address}")
    running_now = {n.spec.name for n in local.nodes if n.running is not None} if local else set()
    started_names = {n.name for n in started} | (running_now - running_before)
    if head.name in started_names:  # a new GCS: every node joined it anew
        started_names = {n.name for n in config.nodes}
    return ClusterUp(
        address=address,
        token_file=token_file,
        local_root=home.ray_root if local is not None else None,
        local_nodes=[n.name for n in config.nodes if n.is_local],
        nodes=[
            NodeState(n.name, "local" if n.is_local else "specd", n.specd, str(token_file))
            for n in config.nodes
        ],
        started=[n.name for n in config.nodes if n.name in started_names],
    )


def loopback_hint(config: ClusterConfig, who: str, address: str) -> str:
    """What to change when `who` failed to join a head that gives its GCS on loopback, in case
    `who` runs on another machine (the file cannot tell: a host name or a LAN address may be
    this machine, and several nodes on one machine join a loopback head fine)."""
    head = config.nodes[0]
    try:
        host = parse_address(address)[0]
    except ValueError:
        return ""
    if not is_loopback(host):
        return ""
    if head.is_local:
        return (
            f"; the head {head.name} is a local node, whose GCS ({address}) only this machine "
            f"can reach: if {who} runs on another machine, list a specd node first to make it "
            "the head"
        )
    return (
        f"; the head {head.name}'s specd gives its GCS as {address}, a loopback address: if "
        f"{who} runs on another machine, set ray.node_ip_address in {head.name}'s specd.toml "
        "to an address it reaches, and restart that specd"
    )


def _undo_start(
    started: list[NodeSpec],
    local: LocalCluster | None,
    running_before: set[str],
    token_file: Path,
) -> list[int]:
    """Stop the specd nodes in `started` (workers first) and the local nodes that were not
    running before; pids on this machine that would not die."""
    for node in reversed(started):
        with contextlib.suppress(ClusterUpError):  # unreachable: nothing more to do from here
            _specd_stop(node, token_file)
    if local is None:
        return []
    if not running_before:
        return local.stop()
    leftover: list[int] = []
    for node in reversed(local.nodes):
        if node.spec.name not in running_before:
            leftover += node.stop()
    return leftover


def _specd_start(
    config: ClusterConfig,
    node: NodeSpec,
    token_file: Path,
    head: str | None,
    started: list[NodeSpec],
    fresh_head: bool = False,
) -> str:
    """Ask the node's specd to start Ray (head when `head` is None); the GCS address. The
    node is added to `started` where its specd started Ray (not found it running). A worker
    found running beside a `fresh_head` (just started) is stopped and started again: it had
    joined the GCS that died with the old head, at the same address."""
    body = {
        "role": "head" if head is None else "worker",
        "labels": {**node.labels, NODE_LABEL: node.name},
    }
    if head is not None:
        body["address"] = head
    _specd_answers(node)
    data = _specd_call(node, token_file, "POST", "/v1/ray/start", body)
    if fresh_head and not data.get("started"):
        _specd_stop(node, token_file)
        data = _specd_call(node, token_file, "POST", "/v1/ray/start", body)
        if not data.get("started"):  # stopped, yet found running: still the dead GCS's
            raise ClusterUpError(
                f"node {node.name}: its Ray had joined the old head's GCS, and stopping it "
                "did not take (its specd found it running again)"
            )
    if data.get("started"):
        started.append(node)
    return str(data["status"]["gcs_address"])


def _specd_stop(node: NodeSpec, token_file: Path) -> None:
    """POST /v1/ray/stop, again while the specd answers 409 (a start in progress there: it
    waits 1 s for it, then says so), for up to SPECD_BUSY_WAIT_S. Taken for unreachable, a
    busy node was reported stopped, and Ray went on running there."""
    deadline = time.monotonic() + SPECD_BUSY_WAIT_S
    while True:
        try:
            _specd_call(node, token_file, "POST", "/v1/ray/stop")
            return
        except ClusterUpError as exc:
            if exc.status != HTTP_CONFLICT or time.monotonic() >= deadline:
                raise
        time.sleep(SPECD_BUSY_POLL_S)


def _specd_answers(node: NodeSpec) -> None:
    """Raise ClusterUpError unless the node's specd answers /health at all (any status: the
    call that follows says what a wrong one means) within SPECD_ANSWER_TIMEOUT_S: a
    `ray start` is waited for much longer."""
    try:
        httpx.get(f"http://{node.specd}/health", timeout=SPECD_ANSWER_TIMEOUT_S)
    except httpx.ConnectTimeout:  # no connection at all: a host down, packets dropped
        raise ClusterUpError(
            f"node {node.name}: specd at {node.specd} unreachable (no connection within "
            f"{SPECD_ANSWER_TIMEOUT_S:g} s)"
        ) from None
    except httpx.TimeoutException:
        raise ClusterUpError(
            f"node {node.name}: specd at {node.specd} accepts connections but did not answer "
            f"/health within {SPECD_ANSWER_TIMEOUT_S:g} s (hung, or not a specd)"
        ) from None
    except httpx.HTTPError as exc:
        raise ClusterUpError(
            f"node {node.name}: specd at {node.specd} unreachable ({exc})"
        ) from None


def _specd_call(
    node: NodeSpec, token_file: Path, method: str, path: str, body: dict | None = None
) -> dict:
    try:
        token = read_token(token_file)
    except TokenError as exc:
        raise ClusterUpError(f"node {node.name}: {exc}") from None
    url = f"http://{node.specd}{path}"
    try:
        response = httpx.request(
            method,
            url,
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=SPECD_TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        raise ClusterUpError(
            f"node {node.name}: specd at {node.specd} unreachable ({exc})"
        ) from None
    if response.status_code == 401:
        raise ClusterUpError(f"node {node.name}: specd at {node.specd} refused the cluster token")
    if response.status_code != 200:
        try:
            message = response.json().get("error", response.text)
        except ValueError:
            message = response.text
        raise ClusterUpError(
            f"node {node.name}: specd {path} failed ({response.status_code}): {message}",
            response.status_code,
        )
    return response.json()


def retire_nodes(
    previous: list[NodeState], kept: list[NodeState], local_root: Path | None, token_file: Path
) -> list[str]:
    """Stop Ray on the nodes a changed file no longer lists (their shards are gone already);
    returns their names."""
    names = {n.name for n in kept}
    gone = [n for n in previous if n.name not in names]
    local = None
    local_gone = [n.name for n in gone if n.kind == "local"]
    if local_gone and local_root is not None:
        specs = [LocalNodeSpec(name) for name in local_gone]
        # every local node retired (the file lists specd nodes alone): the whole of it
        whole = not any(n.kind == "local" for n in kept)
        local = LocalCluster(specs, local_root, token_file, whole=whole)
    take_down_nodes(gone, local)
    return [n.name for n in gone]


def take_down_nodes(nodes: list[NodeState], local: LocalCluster | None) -> list[int]:
    """Stop Ray on every node (workers first); pids that survived on this machine."""
    leftover: list[int] = []
    for node in reversed(nodes):
        if node.kind != "specd":
            continue
        spec = NodeSpec(name=node.name, specd=node.address)
        try:
            _specd_stop(spec, Path(node.token_file))
        except ClusterUpError as exc:
            if exc.status == HTTP_CONFLICT:  # still busy: said, and the state kept for a retry
                raise
            continue  # unreachable: nothing more can be done from here
    if local is not None:
        leftover += local.stop()
    return leftover
