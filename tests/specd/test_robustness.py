"""specd where the fuzzing found it weak: a token file replaced under it, a start or stop
that waits, a failed `ray start`'s output, and its own --help."""

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from daemon.cluster_token import generate_token, write_token
from daemon.specd.api_models import RayStartRequest
from daemon.specd.cli import app
from daemon.specd.config import ConfigError, SpecdConfig, load_config
from daemon.specd.ray_node import LOCK_WAIT_S, RayNode, RayNodeError, failure_cause

from .specd_process import SpecdProcess


def test_help_prints() -> None:
    """A default shown as "[/etc/specd/cluster.token]" read as a closing Rich tag: a crash."""
    result = CliRunner().invoke(app, ["run", "--help"])
    assert result.exit_code == 0, result.output
    assert "/etc/specd/cluster.token" in result.output


def test_a_token_file_replaced_under_specd_is_not_handed_to_ray(tmp_path: Path) -> None:
    token_file = tmp_path / "cluster.token"
    token = generate_token()
    write_token(token_file, token, force=False)
    daemon = SpecdProcess(token_file, token, "rotated")
    try:
        write_token(token_file, generate_token(), force=True)  # `specctl init --force`
        refused = daemon.call("POST", "/v1/ray/start", json={"role": "head"})
        assert refused.status_code == 409, refused.text
        assert "the token changed since specd started" in refused.json()["error"]
        token_file.write_text("garbage\n")  # mode 0600 kept: no cluster token in it
        refused = daemon.call("POST", "/v1/ray/start", json={"role": "head"})
        assert refused.status_code == 409 and "does not hold a cluster token" in refused.text
        assert daemon.call("GET", "/v1/ray/status").json()["running"] is False
    finally:
        daemon.close()


def test_a_start_behind_another_is_refused_at_once(tmp_path: Path) -> None:
    node = RayNode(SpecdConfig(state_dir=str(tmp_path)), tmp_path / "token", lambda: None)  # type: ignore[arg-type, return-value]
    node._lock.acquire()  # a start in progress (`ray start` may take a minute)
    try:
        began = time.monotonic()
        with pytest.raises(RayNodeError, match="in progress") as info:
            node.start(RayStartRequest(role="head"))
        assert info.value.status_code == 409
        assert time.monotonic() - began < LOCK_WAIT_S + 1.0
        assert node.running is None  # a status does not wait for the lock at all
    finally:
        node._lock.release()


@pytest.mark.parametrize(
    ("output", "cause"),
    [
        (
            "Usage stats collection is enabled.\nTraceback (most recent call last):\n"
            '  File "x.py", line 3, in f\n    raise ValueError("no")\n'
            "ray.exceptions.RaySystemError: System error: token mismatch\n",
            "ray.exceptions.RaySystemError: System error: token mismatch",
        ),
        ("Error: port 6379 is in use\n\n", "Error: port 6379 is in use"),
        ("", "no output"),
    ],
)
def test_a_failure_is_said_in_one_line(output: str, cause: str) -> None:
    assert failure_cause(output) == cause


def test_an_address_that_is_no_host_is_refused_by_the_config(tmp_path: Path) -> None:
    for host in ("256.1.1.1", "a..b", "-x"):
        with pytest.raises(ConfigError, match="neither an IP address nor a host name"):
            load_config(None, {"host": host, "state_dir": str(tmp_path)})


def test_an_unexpected_failure_is_a_json_500(tmp_path: Path) -> None:
    """The Ray temp directory is a file: mkdir fails (an OSError), and the answer was a
    plain-text 500."""
    token_file = tmp_path / "cluster.token"
    token = generate_token()
    write_token(token_file, token, force=False)
    daemon = SpecdProcess(token_file, token, "broken")
    try:
        (daemon.state_dir / "ray").write_text("not a directory")
        response = daemon.call("POST", "/v1/ray/start", json={"role": "head"})
        assert response.status_code == 500
        assert response.json()["error"].startswith("ray start failed here: [Errno 17] File exists")
        assert daemon.call("GET", "/health").json() == {"status": "ok"}
    finally:
        daemon.close()
