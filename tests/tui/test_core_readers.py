"""The TUI's readers on real things: this machine and a real specd (and a closed port, and a
wrong token), model directories on disk, log files that grow and turn over, a real store."""

import sqlite3
import time
from pathlib import Path

import pytest

from specctl.config import load_config
from specctl.home import SpecctlHome
from tests.specd.specd_process import SpecdProcess, free_port
from tests.tiny_models import make_tiny_checkpoint
from tests.tui.conftest import specd_cluster
from tests.tui.helpers import EXAMPLE_MODELS, LOCAL_TOML, fill_store
from tui.core.dashboard import DashboardReader
from tui.core.logs import FileFollower, SpecdLogFollower, new_lines
from tui.core.models import find_pairs, scan_catalog
from tui.core.nodes import RayState, read_cluster_nodes
from tui.core.status import read_deployment_status


def test_local_nodes_are_read_on_this_machine() -> None:
    ray = {"verifier-node": RayState("head, 2 node(s) alive in the cluster", True)}
    statuses = read_cluster_nodes(load_config(LOCAL_TOML), 1.0, ray)
    assert [s.name for s in statuses] == ["verifier-node", "drafter-node"]
    for status in statuses:
        assert status.is_reachable and status.problem is None
        assert status.num_cpus and status.memory_total_bytes
    assert statuses[0].ray.is_running is True
    assert statuses[1].ray.is_running is None  # no word from the deployment: unknown


def test_a_specd_node_is_read_through_its_api(specd: SpecdProcess, tmp_path: Path) -> None:
    config = load_config(specd_cluster(tmp_path, f"127.0.0.1:{specd.port}", specd.token_file))
    remote, local = read_cluster_nodes(config, 5.0, {})
    assert remote.is_reachable, remote.problem
    assert remote.hostname == local.hostname  # the same machine, asked two ways
    assert remote.ray == RayState("not running", False)


def test_a_closed_port_is_unreachable_not_an_error(tmp_path: Path, specd: SpecdProcess) -> None:
    closed = f"127.0.0.1:{free_port()}"
    config = load_config(specd_cluster(tmp_path, closed, specd.token_file))
    remote = read_cluster_nodes(config, 1.0, {})[0]
    assert not remote.is_reachable
    assert (
        remote.problem is not None and "unreachable" in remote.problem and closed in remote.problem
    )


def test_a_wrong_token_is_named(
    specd: SpecdProcess, tmp_path: Path, wrong_token_file: Path
) -> None:
    config = load_config(specd_cluster(tmp_path, f"127.0.0.1:{specd.port}", wrong_token_file))
    remote = read_cluster_nodes(config, 5.0, {})[0]
    assert not remote.is_reachable
    assert remote.problem is not None and "refused the cluster token" in remote.problem


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    make_tiny_checkpoint(root / "small-320", seed=0, vocab_size=320, hidden_size=32, num_heads=2)
    make_tiny_checkpoint(root / "big-320", seed=1, vocab_size=320, num_layers=3)
    make_tiny_checkpoint(root / "other-400", seed=2, vocab_size=400)
    (root / "broken").mkdir()
    (root / "broken" / "config.json").write_text("{not json")
    return root


def test_the_catalog_finds_models_and_pairs_sharing_a_vocabulary(model_dirs: Path) -> None:
    configured = {"demo-target": LOCAL_TOML.parents[1] / "packaging/demo-models/target"}
    entries = scan_catalog(configured, [model_dirs, EXAMPLE_MODELS])
    by_label = {e.label: e for e in entries}
    assert entries[0].label == "demo-target"  # configured first, with its [[models]] name
    assert {"draft", "small-320", "big-320", "other-400", "broken"} <= set(by_label)
    assert by_label["big-320"].num_layers == 3 and by_label["big-320"].has_weights
    assert not by_label["llama-3.3-70b-instruct"].has_weights  # config.json only
    assert "cannot read it" in (by_label["broken"].problem or "")
    pairs = {(p.drafter.label, p.verifier.label) for p in find_pairs(entries)}
    assert pairs == {
        ("draft", "demo-target"),
        ("small-320", "big-320"),
        ("llama-3.1-8b-instruct", "llama-3.3-70b-instruct"),
    }


def test_a_log_file_is_followed_through_growth_partial_lines_and_turnover(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    follower = FileFollower(path)
    assert "no log yet" in (follower.read_new().problem or "")
    path.write_text("one\ntwo\nthr")
    assert follower.read_new().lines == ("one", "two")
    with path.open("a") as file:
        file.write("ee\nfour\n")
    assert follower.read_new().lines == ("three", "four")
    assert follower.read_new().lines == ()
    path.write_text("fresh\n")  # truncated and rewritten (a new deployment)
    chunk = follower.read_new()
    assert chunk.is_reset and chunk.lines == ("fresh",)
    path.unlink()
    path.write_text("rotated\n")  # replaced: a new inode
    chunk = follower.read_new()
    assert chunk.is_reset and chunk.lines == ("rotated",)


def test_new_lines_of_a_tail_are_what_follows_the_previous_tail() -> None:
    assert new_lines(["a", "b", "c"], ["b", "c", "d", "e"]) == ["d", "e"]
    assert new_lines(["a", "b"], ["a", "b"]) == []
    assert new_lines([], ["x"]) == ["x"]
    assert new_lines(["a", "b"], ["z"]) == ["z"]


def test_a_specd_log_is_followed(
    specd: SpecdProcess, tmp_path: Path, wrong_token_file: Path
) -> None:
    config = load_config(specd_cluster(tmp_path, f"127.0.0.1:{specd.port}", specd.token_file))
    follower = SpecdLogFollower(config, config.nodes[0], 5.0)
    first = follower.read_new()
    assert first.problem is None and any("specd" in line for line in first.lines), first
    specd.call("GET", "/v1/inventory")  # something new in its log, or nothing: never repeated
    assert not set(follower.read_new().lines) & set(first.lines[-3:])
    wrong = load_config(specd_cluster(tmp_path, f"127.0.0.1:{specd.port}", wrong_token_file))
    refused = SpecdLogFollower(wrong, wrong.nodes[0], 5.0).read_new()
    assert "refused the cluster token" in (refused.problem or "")


def test_the_dashboard_reader_on_a_real_store(tmp_path: Path) -> None:
    path = tmp_path / "specctl.db"
    reader = DashboardReader(path, window_minutes=5)
    missing = reader.read()
    assert missing.state == "missing" and "no store here yet" in missing.message
    fill_store(path, num_seconds=30)
    reading = reader.read()
    assert reading.state == "ok", reading.message
    data = reading.data
    assert data.deployment is not None and data.deployment.name == "local-demo"
    assert len(data.samples) == 30 and data.latest is not None
    assert data.latest.tokens_per_s == 130.0
    assert [g.node_name for g in data.gpu_latest] == ["rtx5090", "spark"]
    assert [r.request_id for r in data.requests] == ["cmpl-0002", "cmpl-0001", "cmpl-0000"]
    # another process holds the file exclusively: busy within the reader's timeout, data kept
    reader.close()  # its idle connection would keep the holder from locking
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        busy = reader.read()
        assert time.monotonic() - started < 5.0  # a bound on hanging, not a speed claim
        assert busy.state == "busy" and "store busy" in busy.message
        assert busy.data.latest is not None and busy.data.latest.tokens_per_s == 130.0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert reader.read().state == "ok"
    reader.close()


def test_gpus_of_a_specd_inventory_are_shown_with_memory_use_and_temperature() -> None:
    """specd's inventory JSON for a GB10 (unified memory) and a 5090, as NVML reports them."""
    from specctl.config.schema import NodeSpec
    from tui.core.nodes import status_from_inventory
    from tui.screens.nodes import gpu_row

    inventory = {
        "node_name": "spark",
        "host": {
            "hostname": "spark",
            "num_cpus": 20,
            "memory_total_bytes": 128 * 2**30,
            "memory_available_bytes": 100 * 2**30,
        },
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA GB10",
                "memory_total_bytes": 119 * 2**30,
                "memory_used_bytes": 60 * 2**30,
                "unified_memory": True,
                "utilization_gpu_percent": 93,
                "temperature_c": 71,
            },
            {
                "index": 1,
                "name": "NVIDIA GeForce RTX 5090",
                "memory_total_bytes": 32 * 2**30,
                "memory_used_bytes": None,
                "utilization_gpu_percent": None,
                "temperature_c": None,
            },
        ],
    }
    node = NodeSpec(name="spark", specd="spark.local:7601")
    status = status_from_inventory(node, inventory, RayState("head", True), 0.0)
    assert status.gpu_note is None and len(status.gpus) == 2
    unified = gpu_row("spark", status.gpus[0])
    assert unified[1] == "0: NVIDIA GB10"
    assert "60.0 GiB / 119.0 GiB (unified)" in str(unified[2])
    assert unified[3:] == ("93%", "71 °C")
    unknown = gpu_row("spark", status.gpus[1])
    assert "– / 32.0 GiB" in str(unknown[2]) and unknown[3:] == ("–", "–")


def test_local_ray_state_of_nodes_apply_left_behind_or_never_started(tmp_path: Path) -> None:
    """A node directory with no live Ray is "not running"; a broken head-port record is
    "unknown" with the reason, never an exception (the Launch and Nodes screens read this)."""
    import shutil

    from specctl.cluster.local_cluster import HEAD_PORT_FILE, node_dir_name
    from specctl.home import SpecctlHome
    from tui.core.status import local_ray_state

    root, token = SpecctlHome(tmp_path).ray_root, tmp_path / "cluster.token"  # short, in /tmp
    try:
        assert local_ray_state(root, "verifier-node", token) == RayState("not running", False)
        (root / node_dir_name("verifier-node")).mkdir(parents=True)
        assert local_ray_state(root, "verifier-node", token) == RayState("not running", False)
        (root / HEAD_PORT_FILE).write_text(str(free_port()))
        assert local_ray_state(root, "verifier-node", token) == RayState("not running", False)
        (root / HEAD_PORT_FILE).write_text("not a port")
        broken = local_ray_state(root, "verifier-node", token)
        assert broken.is_running is None and broken.summary.startswith("unknown: ")
        long_root = tmp_path / ("deep" * 20)
        (long_root / node_dir_name("verifier-node")).mkdir(parents=True)
        (long_root / HEAD_PORT_FILE).write_text(str(free_port()))
        assert "too long" in local_ray_state(long_root, "verifier-node", token).summary
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_damaged_server_record_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    """read in a worker thread: its exception ended the whole app."""
    (tmp_path / "server.json").write_text('{"pid": 0}')
    status = read_deployment_status(SpecctlHome(tmp_path))
    assert status.problem is not None and "not a serving-process record" in status.problem
