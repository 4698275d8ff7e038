"""`specctl apply` on broken cluster files, through the real CLI: one clear error naming the
file, the line and the field (exit 2), or the plan's reason when the models do not fit (exit
1); no traceback, and nothing started."""

import json
from pathlib import Path

import pytest

from .cluster_files import EXAMPLES, SPARK_5090, replace_line, write_cluster
from .deployment_cli import Cli, free_port, local_cluster_file
from .test_config_errors import CASES

ASKED_BY_THE_ISSUE = ("missing field", "wrong type", "unknown node", "unknown model")
SELECTED = [case for case in CASES if case[0] in ASKED_BY_THE_ISSUE or "TOML" in case[0]]


def _assert_nothing_started(cli: Cli) -> None:
    assert cli.processes() == []
    assert not (cli.home / "state.json").exists()


@pytest.mark.parametrize(("what", "edits", "expected"), SELECTED, ids=[c[0] for c in SELECTED])
def test_broken_file(
    tmp_path: Path, what: str, edits: list[tuple[str, str]], expected: str
) -> None:
    text = SPARK_5090
    for old, new in edits:
        text = replace_line(text, old, new)
    path, line = write_cluster(tmp_path, text)
    cli = Cli(tmp_path / "home")
    done = cli.run("apply", str(path))
    assert done.returncode == 2, (what, done.stdout, done.stderr)
    assert f"specctl: error: {path}:{line}: {expected}" in done.stderr
    assert "Traceback" not in done.stderr
    _assert_nothing_started(cli)


def test_broken_file_as_json_ends_with_an_outcome(tmp_path: Path) -> None:
    text = replace_line(SPARK_5090, "port = 8000", 'port = "8000"')
    path, _ = write_cluster(tmp_path, text)
    done = Cli(tmp_path / "home").run("apply", "--json", str(path))
    assert done.returncode == 2
    outcome = json.loads(done.stdout.splitlines()[-1])
    assert outcome["kind"] == "outcome" and not outcome["is_ok"]
    assert "server.port: Input should be a valid integer" in outcome["message"]


def test_a_model_that_does_not_fit_is_refused_before_anything_starts(tmp_path: Path) -> None:
    big = (
        EXAMPLES / "models" / "llama-3.3-70b-instruct",
        EXAMPLES / "models" / "llama-3.1-8b-instruct",
        "bfloat16",
    )
    config = local_cluster_file(tmp_path / "cluster.toml", free_port(), models=big)
    cli = Cli(tmp_path / "home")
    done = cli.run("apply", str(config))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the plan does not fit" in done.stderr and "verifier-node" in done.stderr
    assert "Traceback" not in done.stderr
    _assert_nothing_started(cli)
