"""`specctl apply` through specd, the way a cluster of machines runs: two real specd daemons on
loopback, each starting its node's Ray when apply asks (the first node the head), the demo
pair's verifier on one and its drafter on the other, the serving process on this machine. A
head whose raylet died is started again through its specd, the worker is made to join the new
GCS, the shards are replaced, and `down` stops Ray through both daemons.

Where this machine allows a mount namespace (root), each specd runs in one of its own in which
the demo models are mounted at a path that does not exist out here: the models are on the
nodes alone, as on machines apart. The plan then reads their config.json through the specds,
the shards load them there, and the serving process gets the tokenizer from the verifier."""

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.cluster_token import generate_token, write_token
from tests.distributed.ray_cluster import raylet_pids
from tests.specd.specd_process import SpecdProcess, nodes_only_prefix

from .deployment_cli import (
    DEMO_DRAFT,
    DEMO_TARGET,
    PROMPTS,
    Cli,
    free_port,
    greedy_ids,
    local_cluster_file,
    openai_client,
    target_only_ids,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def specd_cluster_file(
    path: Path, daemons: dict[str, SpecdProcess], token_file: Path, models_root: Path | None
) -> Path:
    """local_cluster_file's deployment, each node run by its specd (the models at
    `models_root`, where given)."""
    models = (
        (models_root / "target", models_root / "draft", "float32")
        if models_root is not None
        else (DEMO_TARGET, DEMO_DRAFT, "float32")
    )
    text = local_cluster_file(path, free_port(), models=models).read_text()
    for name, daemon in daemons.items():
        local = f'name = "{name}"\nspecd = "local"\n'
        assert local in text
        remote = f'name = "{name}"\nspecd = "127.0.0.1:{daemon.port}"\n'
        remote += f'token_file = "{token_file}"\n'
        text = text.replace(local, remote)
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def specd_deployment(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Cli, Path, dict[str, SpecdProcess]]]:
    root = tmp_path_factory.mktemp("apply-specd")
    token_file, token = root / "cluster.token", generate_token()
    write_token(token_file, token, force=False)
    daemons: dict[str, SpecdProcess] = {}
    cli = Cli(root / "home")
    models_root = root / "models-on-nodes"
    models_root.mkdir()
    prefix = nodes_only_prefix(models_root)
    try:
        for name in ("verifier-node", "drafter-node"):
            daemons[name] = SpecdProcess(token_file, token, name, prefix=prefix or ())
        config = specd_cluster_file(
            root / "cluster.toml", daemons, token_file, models_root if prefix else None
        )
        done = cli.apply(config)
        assert done.returncode == 0, done.stdout + done.stderr
        yield cli, config, daemons
        done = cli.run("down", timeout_s=180)
        assert done.returncode == 0, done.stdout + done.stderr
        for name, daemon in daemons.items():
            assert daemon.ray_pids() == [], f"{name}: Ray left running after down"
        assert cli.processes() == []
    finally:
        cli.run("down", timeout_s=180)
        for daemon in daemons.values():
            daemon.close()


def test_the_models_are_on_the_nodes_alone(
    specd_deployment: tuple[Cli, Path, dict[str, SpecdProcess]],
) -> None:
    """Nothing at the models' paths here: the plan read config.json through the specds."""
    cli, config, _ = specd_deployment
    paths = re.findall(r'^path = "(.*)"$', config.read_text(), re.M)
    if str(DEMO_TARGET) in paths:
        pytest.skip("no mount namespace here (not root): the nodes share this machine's paths")
    assert len(paths) == 2 and not any(Path(p).exists() for p in paths), paths
    assert cli.status()["is_healthy"]


def test_greedy_output_through_specd_nodes_equals_target_only(
    specd_deployment: tuple[Cli, Path, dict[str, SpecdProcess]],
) -> None:
    cli, _, _ = specd_deployment
    report = cli.status()
    assert report["is_healthy"], report
    nodes = {s["role"]: s["running_on"] for s in report["shards"]}
    assert nodes == {"verifier": "verifier-node", "drafter": "drafter-node"}, report
    assert greedy_ids(openai_client(cli), PROMPTS[:2]) == target_only_ids(PROMPTS[:2])


def test_a_second_apply_changes_nothing(
    specd_deployment: tuple[Cli, Path, dict[str, SpecdProcess]],
) -> None:
    cli, config, _ = specd_deployment
    before = cli.status()
    done = cli.apply(config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "changed: nothing" in done.stdout, done.stdout + done.stderr
    assert [s["pid"] for s in cli.status()["shards"]] == [s["pid"] for s in before["shards"]]


def test_a_head_whose_raylet_died_is_started_again_through_its_specd(
    specd_deployment: tuple[Cli, Path, dict[str, SpecdProcess]],
) -> None:
    """The head's specd starts Ray again (a new GCS); the worker's, asked to start, found its
    Ray running, joined to the dead GCS: apply has it stopped and started again, then
    replaces every shard and the serving process."""
    cli, config, daemons = specd_deployment
    head, worker = daemons["verifier-node"], daemons["drafter-node"]
    before = cli.status()
    worker_raylets = raylet_pids(worker.state_dir)
    (raylet,) = raylet_pids(head.state_dir)
    os.kill(raylet, signal.SIGKILL)
    done = cli.apply(config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "server replacing the serving process" in done.stderr, done.stderr
    assert raylet_pids(head.state_dir) not in ([], [raylet])
    assert raylet_pids(worker.state_dir) not in ([], worker_raylets)  # joined the new GCS
    after = cli.status()
    assert after["is_healthy"], after
    assert after["server_pid"] != before["server_pid"]
    assert not {s["pid"] for s in after["shards"]} & {s["pid"] for s in before["shards"]}
    assert greedy_ids(openai_client(cli), PROMPTS[:1]) == target_only_ids(PROMPTS[:1])
    again = cli.apply(config)
    assert "changed: nothing" in again.stdout, again.stdout + again.stderr
