"""`specctl apply` of a deployment whose drafter and verifier are each split over two
tensor-parallel ranks: the official client's greedy output equals target-only `specctl
generate`, and `specctl down` leaves no process (the rank actors included)."""

from collections.abc import Iterator

import openai
import pytest

from tests.control.deployment_cli import (
    PROMPTS,
    Cli,
    free_port,
    greedy_ids,
    local_cluster_file,
    target_only_ids,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    root = tmp_path_factory.mktemp("apply-tp")
    cli = Cli(root / "home")
    config = local_cluster_file(root / "cluster.toml", free_port(), tensor_parallel_size=2)
    done = cli.apply(config)
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "2 tensor-parallel ranks on verifier-node" in done.stderr + done.stdout
        assert "2 tensor-parallel ranks on drafter-node" in done.stderr + done.stdout
        yield cli
    finally:
        cli.run("down", timeout_s=180)
        leftover = cli.processes()
        assert not leftover, f"processes left after down: {leftover}"


def test_tp2_deployment_greedy_equals_generate_target_only(deployment: Cli) -> None:
    status = deployment.status()
    assert {s["role"]: s["node"] for s in status["shards"]} == {
        "verifier": "verifier-node",
        "drafter": "drafter-node",
    }
    client = openai.OpenAI(base_url=status["endpoint"], api_key="-", timeout=60, max_retries=0)
    assert greedy_ids(client, PROMPTS) == target_only_ids(PROMPTS)


def test_down_stops_every_rank(deployment: Cli) -> None:
    assert deployment.processes()
    done = deployment.run("down", timeout_s=180)
    assert done.returncode == 0, done.stderr
    assert deployment.processes() == []
