"""`specctl apply` of a verifier split 4:2 over two local Ray nodes (pipeline parallel) with
its drafter on a third: status lists the stage on its node, the official client's greedy output
equals target-only `specctl generate`, and `specctl down` leaves no process."""

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from safetensors.torch import load_file, save_file

from tests.control.deployment_cli import (
    DEMO_DRAFT,
    DEMO_TARGET,
    PROMPTS,
    Cli,
    free_port,
    greedy_ids,
    target_only_ids,
)
from tests.distributed.ray_cluster import raylet_pids

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _cluster_file(path: Path, port: int) -> Path:
    nodes = "".join(
        f'[[nodes]]\nname = "{n}"\nspecd = "local"\n\n'
        for n in ("verifier-node", "stage-node", "drafter-node")
    )
    path.write_text(
        f"""{nodes}[[models]]
name = "demo-target"
path = "{DEMO_TARGET}"
dtype = "float32"

[[models]]
name = "demo-draft"
path = "{DEMO_DRAFT}"
dtype = "float32"

[deployment]
name = "pp-demo"

[deployment.verifier]
model = "demo-target"
nodes = ["verifier-node", "stage-node"]
pipeline_split = [4, 2]

[deployment.drafter]
model = "demo-draft"
node = "drafter-node"

[deployment.speculation]
k = 4

[server]
host = "127.0.0.1"
port = {port}
max_batch_size = 8
"""
    )
    return path


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    root = tmp_path_factory.mktemp("apply-pp")
    cli = Cli(root / "home")
    done = cli.apply(_cluster_file(root / "cluster.toml", free_port()))
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        yield cli
    finally:
        cli.run("down", timeout_s=180)
        leftover = cli.processes()
        assert not leftover, f"processes left after down: {leftover}"


def test_pipeline_deployment_greedy_equals_generate_target_only(deployment: Cli) -> None:
    status = deployment.status()
    where = sorted((s["role"], s["node"], s["state"]) for s in status["shards"])
    assert where == [
        ("drafter", "drafter-node", "ready"),
        ("stage", "stage-node", "ready"),
        ("verifier", "verifier-node", "ready"),
    ]
    client = openai.OpenAI(base_url=status["endpoint"], api_key="-", timeout=60, max_retries=0)
    assert greedy_ids(client, PROMPTS) == target_only_ids(PROMPTS)


def test_second_apply_changes_nothing(deployment: Cli) -> None:
    before = deployment.status()
    done = deployment.apply(Path(before["config_path"]))
    assert done.returncode == 0, done.stderr
    after = deployment.status()
    assert [s["pid"] for s in after["shards"]] == [s["pid"] for s in before["shards"]]
    assert "changed: nothing" in done.stdout


def test_a_stage_node_whose_raylet_died_takes_its_verifier_along(deployment: Cli) -> None:
    """The verifier finds its stages once, at load: with the stage alone replaced, it called
    the dead stage's handle, and every request failed until another apply."""
    before = deployment.status()
    node_root = deployment.ray_root() / "stage-node"
    raylets = raylet_pids(node_root)
    assert len(raylets) == 1
    os.kill(raylets[0], signal.SIGKILL)
    done = deployment.apply(Path(before["config_path"]))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verifier r0 on verifier-node (a pipeline stage's Ray restarted)" in done.stderr
    deadline = time.monotonic() + 30  # the server looks at its shards every 2 s
    while not (status := deployment.status())["is_healthy"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert status["is_healthy"], status
    client = openai.OpenAI(base_url=status["endpoint"], api_key="-", timeout=60, max_retries=0)
    assert greedy_ids(client, PROMPTS) == target_only_ids(PROMPTS)


def test_a_new_stage_that_would_not_load_stops_no_running_shard(
    deployment: Cli, tmp_path: Path
) -> None:
    """A third stage added (on the drafter's node) with a model whose last layers are not in
    its weights: the running verifier and stage are replaced to reach it, and were stopped
    before it failed to load. Every shard the apply starts is now checked first, the new one
    (which runs nowhere yet) too."""
    before = deployment.status()
    config = Path(before["config_path"])
    text = config.read_text()
    copy = Path(shutil.copytree(DEMO_TARGET, tmp_path / "target-copy"))
    tensors = load_file(copy / "model.safetensors")
    last_two = ("model.layers.4.", "model.layers.5.")
    kept = {n: t for n, t in tensors.items() if not n.startswith(last_two)}
    save_file(kept, copy / "model.safetensors", metadata={"format": "pt"})
    changed = text.replace(f'path = "{DEMO_TARGET}"', f'path = "{copy}"')
    changed = changed.replace(
        'nodes = ["verifier-node", "stage-node"]\npipeline_split = [4, 2]',
        'nodes = ["verifier-node", "stage-node", "drafter-node"]\npipeline_split = [2, 2, 2]',
    )
    assert changed.count(str(copy)) == 1 and "[2, 2, 2]" in changed
    config.write_text(changed)
    try:
        done = deployment.apply(config)
    finally:
        config.write_text(text)
    assert done.returncode == 1, done.stdout + done.stderr
    said = f"stage2 r0 on drafter-node: {copy}: missing tensor 'model.layers.4."
    assert said in done.stderr, done.stderr
    assert "no running shard was stopped" in done.stderr
    after = deployment.status()
    assert [s["pid"] for s in after["shards"]] == [s["pid"] for s in before["shards"]]
    assert after["is_healthy"], after
    again = deployment.apply(config)
    assert "changed: nothing" in again.stdout, again.stdout + again.stderr
