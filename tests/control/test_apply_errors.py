"""`specctl apply` on broken cluster files, through the real CLI: one clear error naming the
file, the line and the field (exit 2), or the plan's reason when the models do not fit (exit
1); no traceback, and nothing started."""

import http.server
import json
import shutil
import threading
from pathlib import Path

import pytest

from daemon.cluster_token import generate_token, write_token
from specctl.apply import cluster_up
from specctl.apply.state import NodeState
from specctl.config.loader import load_config_text

from .cluster_files import EXAMPLES, SPARK_5090, replace_line, write_cluster
from .deployment_cli import DEMO_DRAFT, DEMO_TARGET, Cli, free_port, local_cluster_file
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


def test_a_failed_apply_stops_the_nodes_it_started(tmp_path: Path) -> None:
    """The head (local) starts, the second node's specd does not answer: apply fails naming
    it, and the head it started is stopped again (no deployment is recorded that `down`
    could find it by)."""
    token = tmp_path / "token"
    write_token(token, generate_token(), force=False)
    config = tmp_path / "cluster.toml"
    config.write_text(
        f"""\
[[nodes]]
name = "head"
specd = "local"

[[nodes]]
name = "away"
specd = "127.0.0.1:{free_port()}"
token_file = "{token}"
memory_gib = 10

[[models]]
name = "demo-target"
path = "{DEMO_TARGET}"
dtype = "float32"

[deployment]
name = "rollback"

[deployment.verifier]
model = "demo-target"
nodes = ["head"]

[deployment.drafter]
model = "ngram"

[server]
host = "127.0.0.1"
port = {free_port()}
"""
    )
    cli = Cli(tmp_path / "home")
    done = cli.apply(config)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "node away: specd at 127.0.0.1:" in done.stderr and "unreachable" in done.stderr
    assert "Traceback" not in done.stderr
    _assert_nothing_started(cli)
    down = cli.run("down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert cli.processes() == []


def test_a_plan_the_runtime_cannot_load_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    """The seed file plans the 70B in fp8 (to size the machines); the shards load float32,
    bfloat16 or float16, and apply says so at its plan step, naming the shard."""
    path, _ = write_cluster(tmp_path, SPARK_5090)
    cli = Cli(tmp_path / "home")
    done = cli.run("apply", "--json", str(path))
    assert done.returncode == 1, done.stdout + done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    failed = [e for e in events if e.get("state") == "failed"]
    assert [e["name"] for e in failed] == ["plan"]
    assert "r0/verifier/stage0: dtype fp8 is for planning only" in failed[0]["detail"]
    assert "Traceback" not in done.stderr
    _assert_nothing_started(cli)


def test_every_problem_of_a_file_is_its_own_error_line(tmp_path: Path) -> None:
    text = replace_line(SPARK_5090, "port = 8000", 'port = "x"')
    text = replace_line(text, "max_batch_size = 8", 'max_batch_size = "y"')
    path, _ = write_cluster(tmp_path, text)
    cli = Cli(tmp_path / "home")
    done = cli.run("apply", str(path))
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "server." in line]
    assert len(errors) == 2 and all(line.startswith("specctl: error: ") for line in errors)
    as_json = cli.run("apply", "--json", str(path))
    events = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [(e["name"], e["state"]) for e in events if e["kind"] == "step"] == [
        ("validate", "started"),
        ("validate", "failed"),
    ]
    assert events[-1]["kind"] == "outcome" and "server.max_batch_size" in events[-1]["message"]


def test_a_refused_file_leaves_no_home_behind(tmp_path: Path) -> None:
    path, _ = write_cluster(tmp_path, replace_line(SPARK_5090, "port = 8000", 'port = "x"'))
    cli = Cli(tmp_path / "home")
    assert cli.run("apply", str(path)).returncode == 2
    assert not (tmp_path / "home").exists()


class _BusySpecd(http.server.BaseHTTPRequestHandler):
    """A specd that is busy with a start for its first `busy` stops (409), then stops."""

    busy = 2
    calls = 0

    def do_POST(self) -> None:
        type(self).calls += 1
        busy = type(self).calls <= type(self).busy
        body = (
            {"error": "a Ray start or stop is in progress here; stop again later"}
            if busy
            else {"stopped": True, "leftover_pids": []}
        )
        data = json.dumps(body).encode()
        self.send_response(409 if busy else 200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None: ...


def test_down_waits_out_a_specd_busy_with_a_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 409 (a start in progress there) was taken for an unreachable node: `down` reported
    it stopped, and its Ray went on running."""
    token = tmp_path / "token"
    write_token(token, generate_token(), force=False)
    server = http.server.HTTPServer(("127.0.0.1", free_port()), _BusySpecd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    node = NodeState("busy", "specd", f"127.0.0.1:{server.server_port}", str(token))
    monkeypatch.setattr(cluster_up, "SPECD_BUSY_POLL_S", 0.05)
    try:
        assert cluster_up.take_down_nodes([node], None) == []
        assert _BusySpecd.calls == 3
        _BusySpecd.calls, _BusySpecd.busy = 0, 10**6  # busy for good
        monkeypatch.setattr(cluster_up, "SPECD_BUSY_WAIT_S", 0.3)
        with pytest.raises(cluster_up.ClusterUpError, match=r"\(409\): a Ray start or stop"):
            cluster_up.take_down_nodes([node], None)
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    ("head_specd", "gcs", "hint"),
    [
        ("127.0.0.1:7601", "127.0.0.1:6379", "set ray.node_ip_address in spark's specd.toml"),
        ("local", "127.0.0.1:6379", "list a specd node first to make it the head"),
        ("spark.local:7601", "[::1]:6379", "set ray.node_ip_address in spark's specd.toml"),
        ("spark.local:7601", "10.0.0.11:6379", ""),  # a GCS others can dial: nothing to add
        ("spark.local:7601", "not an address", ""),
    ],
)
def test_a_node_that_cannot_join_a_loopback_head_is_told_what_to_change(
    head_specd: str, gcs: str, hint: str
) -> None:
    """A head whose specd.toml sets no ray.node_ip_address (or a local head) gives its GCS as
    127.0.0.1:PORT, which only its own machine can dial. Whether a node is on another machine
    the file cannot tell (a host name or a LAN address may be this one), so nothing is refused
    up front: where a node fails to join, its error says what to change if it is."""
    text = replace_line(SPARK_5090, 'specd = "spark.local:7601"', f'specd = "{head_specd}"')
    said = cluster_up.loopback_hint(load_config_text(text), "rtx5090", gcs)
    if not hint:
        assert said == ""
        return
    assert said.startswith("; the head spark") and gcs in said
    assert "if rtx5090 runs on another machine" in said and hint in said


class _Healthy(http.server.BaseHTTPRequestHandler):
    """Another program on the endpoint's port, answering any GET with 200."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"status": "ready"}')

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_port_another_program_listens_on_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    """Its 200s answered the new server's health checks: apply said it served while its
    server had died failing to bind, and requests reached the other program."""
    other = http.server.HTTPServer(("127.0.0.1", free_port()), _Healthy)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        port = other.server_port
        config = local_cluster_file(tmp_path / "cluster.toml", port)
        cli = Cli(tmp_path / "home")
        done = cli.apply(config)
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"cannot serve on 127.0.0.1:{port}: Address already in use" in done.stderr
        assert "Traceback" not in done.stderr
        _assert_nothing_started(cli)
    finally:
        other.shutdown()
        other.server_close()


def test_a_first_apply_that_fails_to_load_leaves_nothing_running(tmp_path: Path) -> None:
    """The target's weights are missing (the plan reads config.json only): the nodes and the
    drafter shard had started, and stayed, with a status that said to apply again."""
    target = tmp_path / "no-weights"
    shutil.copytree(DEMO_TARGET, target, ignore=shutil.ignore_patterns("*.safetensors"))
    config = local_cluster_file(
        tmp_path / "cluster.toml", free_port(), models=(target, DEMO_DRAFT, "float32")
    )
    cli = Cli(tmp_path / "home")
    done = cli.apply(config)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "model.safetensors" in done.stderr, done.stderr
    assert "nodes, shards and server were stopped again" in done.stderr
    assert "Traceback" not in done.stderr
    _assert_nothing_started(cli)
