"""Node facts from a real specd on loopback: the inventory when it answers, the declared
hardware (or "unknown", with the reason) when it cannot be asked."""

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from specd.specd_process import SpecdProcess, free_port

from daemon.cluster_token import generate_token, write_token
from specctl.config import load_config
from specctl.planner import gather_node_facts, make_plan

from .cluster_files import REPO_ROOT, write_cluster

DEMO = REPO_ROOT / "packaging" / "demo-models"


@pytest.fixture(scope="module")
def specd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SpecdProcess, Path]]:
    token_file = tmp_path_factory.mktemp("token") / "cluster.token"
    token = generate_token()
    write_token(token_file, token, force=False)
    daemon = SpecdProcess(token_file, token, "probed")
    try:
        yield daemon, token_file
    finally:
        daemon.close()


def _cluster(directory: Path, address: str, token_file: Path, extra: str = "") -> Path:
    text = f"""
[[nodes]]
name = "here"
specd = "local"

[[nodes]]
name = "remote"
specd = "{address}"
token_file = "{token_file}"
{extra}

[[models]]
name = "target"
path = "{DEMO}/target"

[[models]]
name = "draft"
path = "{DEMO}/draft"

[deployment.verifier]
model = "target"
nodes = ["here"]

[deployment.drafter]
model = "draft"
node = "remote"
"""
    path, _ = write_cluster(directory, text)
    return path


def test_inventory_from_specd_feeds_the_plan(
    specd: tuple[SpecdProcess, Path], tmp_path: Path
) -> None:
    daemon, token_file = specd
    config = load_config(_cluster(tmp_path, f"127.0.0.1:{daemon.port}", token_file))
    facts = gather_node_facts(config)  # "auto": remote declares nothing, so specd is asked
    remote = facts["remote"]
    assert remote.source == "specd" and remote.note == f"specd at 127.0.0.1:{daemon.port}"
    assert remote.memory_total_bytes and remote.memory_total_bytes > 2**30
    assert remote.gpus == []  # this machine has none; NVML says so and specd reports it
    # specd runs on this very machine: its node and the local one share one memory pool
    assert remote.machine == facts["here"].machine
    plan = make_plan(config, facts)
    assert plan.verdict == "fits", plan.problems
    assert [(s.role, s.node, s.device) for s in plan.shards] == [
        ("drafter", "remote", "cpu"),
        ("verifier", "here", "cpu"),
    ]
    assert any(
        line.startswith(f"remote: specd at 127.0.0.1:{daemon.port}: no GPU")
        for line in plan.explanation
    )


def test_wrong_token_falls_back_to_the_declaration(
    specd: tuple[SpecdProcess, Path], tmp_path: Path
) -> None:
    daemon, _ = specd
    wrong = tmp_path / "wrong.token"
    write_token(wrong, generate_token(), force=False)
    path = _cluster(tmp_path, f"127.0.0.1:{daemon.port}", wrong, extra="memory_gib = 16")
    config = load_config(path)
    facts = gather_node_facts(config, mode="probe")
    assert facts["remote"].source == "declared"
    assert facts["remote"].note == (
        f"specd at 127.0.0.1:{daemon.port}: specd refused the cluster token (is it the same on "
        "both ends?); using the declared hardware"
    )
    assert facts["remote"].memory_total_bytes == 16 * 2**30
    assert gather_node_facts(config)["remote"].note == (
        "as declared in the cluster file (specd not asked; --probe asks it)"
    )


def test_unreachable_specd_without_a_declaration_is_unknown(
    specd: tuple[SpecdProcess, Path], tmp_path: Path
) -> None:
    _, token_file = specd
    port = free_port()  # nothing listens there
    config = load_config(_cluster(tmp_path, f"127.0.0.1:{port}", token_file))
    facts = gather_node_facts(config, timeout_s=2.0)
    assert facts["remote"].source == "unknown"
    assert facts["remote"].note is not None
    assert facts["remote"].note.startswith(f"specd at 127.0.0.1:{port}: unreachable (ConnectError")
    plan = make_plan(config, facts)
    assert plan.verdict == "unknown"
    # the CLI says so too, with its own exit status
    result = subprocess.run(
        [sys.executable, "-m", "specctl.cli", "plan", str(tmp_path / "cluster.toml")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert "fit unknown" in result.stdout and "cannot check the fit on remote" in result.stdout


def test_missing_token_file_is_named(tmp_path: Path) -> None:
    config = load_config(_cluster(tmp_path, "127.0.0.1:9", tmp_path / "no.token"))
    facts = gather_node_facts(config, mode="probe", timeout_s=1.0)
    assert facts["remote"].source == "unknown"
    assert f"{tmp_path}/no.token: token file not found" in (facts["remote"].note or "")
