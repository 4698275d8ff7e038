"""A model's config.json read through real specd daemons: the first node that has it answers,
a multimodal checkpoint's text_config is its shape as it is here, and each node that cannot
answer (no such directory, nothing listening, a token file missing) is named with why."""

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.cluster_token import generate_token, write_token
from specctl.config import ConfigError, load_config_text
from specctl.config.model_shape import read_model_shape, shape_from_file
from specctl.config.node_model_config import first_config
from tests.specd.specd_process import SpecdProcess, free_port

from .deployment_cli import DEMO_TARGET, REPO_ROOT

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    path = tmp_path_factory.mktemp("token") / "cluster.token"
    token = generate_token()
    write_token(path, token, force=False)
    yield path, token


@pytest.fixture(scope="module")
def specd(token_file: tuple[Path, str]) -> Iterator[SpecdProcess]:
    daemon = SpecdProcess(token_file[0], token_file[1], "box")
    try:
        yield daemon
    finally:
        daemon.close()


def _config(nodes: list[tuple[str, str, Path]], model: Path) -> str:
    """Two specd nodes (name, address, token file); the verifier over them, target at `model`."""
    text = "".join(
        f'[[nodes]]\nname = "{n}"\nspecd = "{a}"\ntoken_file = "{t}"\n\n' for n, a, t in nodes
    )
    names = ", ".join(f'"{n}"' for n, _, _ in nodes)
    return text + (
        f'[[models]]\nname = "target"\npath = "{model}"\n\n'
        f'[deployment.verifier]\nmodel = "target"\nnodes = [{names}]\n\n'
        '[deployment.drafter]\nmodel = "ngram"\n'
    )


def test_the_first_node_that_has_it_answers(
    specd: SpecdProcess, token_file: tuple[Path, str]
) -> None:
    token = token_file[0]
    dead = f"127.0.0.1:{free_port()}"
    config = load_config_text(
        _config([("dead", dead, token), ("box", f"127.0.0.1:{specd.port}", token)], DEMO_TARGET)
    )
    node, raw, said, _ = first_config(config, list(config.nodes), DEMO_TARGET, 5.0)
    assert node is not None and node.name == "box" and said == []
    assert raw == json.loads((DEMO_TARGET / "config.json").read_text())


def test_what_each_node_said_when_none_has_it(
    specd: SpecdProcess, token_file: tuple[Path, str], tmp_path: Path
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    missing_token = tmp_path / "no.token"
    nodes = [
        ("box", f"127.0.0.1:{specd.port}", token_file[0]),
        ("dead", dead, token_file[0]),
        ("tokenless", "127.0.0.1:9", missing_token),
    ]
    gone = tmp_path / "gone"
    config = load_config_text(_config(nodes, DEMO_TARGET))
    node, raw, said, _ = first_config(config, list(config.nodes), gone, 5.0)
    assert node is None and raw is None
    assert said[0] == (
        f"node box: specd at 127.0.0.1:{specd.port}: model directory {gone} does not exist on "
        "this node"
    )
    assert said[1].startswith(f"node dead: specd at {dead} unreachable (ConnectError")
    assert said[2].startswith(f"node tokenless: cannot ask its specd: {missing_token}")


def test_a_multimodal_model_read_through_its_node_is_its_text_config(
    specd: SpecdProcess, token_file: tuple[Path, str], tmp_path: Path
) -> None:
    """The shape made of a node's answer is the one read here: a multimodal checkpoint's
    text_config (it was the outer object's, which has no layers)."""
    inner = json.loads((DEMO_TARGET / "config.json").read_text())
    outer = {"architectures": ["Gemma3ForConditionalGeneration"], "text_config": inner}
    (tmp_path / "config.json").write_text(json.dumps(outer))
    config = load_config_text(
        _config([("box", f"127.0.0.1:{specd.port}", token_file[0])], DEMO_TARGET)
    )
    node, raw, _, _ = first_config(config, list(config.nodes), tmp_path, 5.0)
    assert node is not None and raw == outer
    assert shape_from_file(raw, "box") == read_model_shape(tmp_path)
    assert read_model_shape(tmp_path).num_layers == inner["num_hidden_layers"]


def test_offline_asks_no_node(tmp_path: Path) -> None:
    """`specctl plan --offline` asks no node: a model not here is an error that says so."""
    text = _config([("box", f"127.0.0.1:{free_port()}", tmp_path / "t")], tmp_path / "gone")
    with pytest.raises(ConfigError) as caught:
        load_config_text(text, nodes_timeout_s=None)
    assert "does not exist on this machine; its nodes were not asked (offline)" in str(caught.value)


def test_a_node_only_model_whose_nodes_are_all_down_is_unknown_not_invalid(
    specd: SpecdProcess, token_file: tuple[Path, str], tmp_path: Path
) -> None:
    """No node that loads the model answers: the file may well be right. `plan` exits 3 (the
    fit cannot be checked), `apply` 1 (a failure to reach them), not 2 (an invalid file); a
    node that answers "no such directory" leaves it invalid."""
    token = token_file[0]
    downs = [("a", f"127.0.0.1:{free_port()}", token), ("b", f"127.0.0.1:{free_port()}", token)]
    gone = tmp_path / "kept-on-the-nodes"
    config = load_config_text(_config(downs, DEMO_TARGET))
    *_, none_answered = first_config(config, list(config.nodes), gone, 5.0)
    assert none_answered
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(_config(downs, gone))
    with pytest.raises(ConfigError) as caught:
        load_config_text(cluster.read_text(), cluster)
    assert caught.value.unreachable
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SPECCTL_HOME": str(tmp_path / "home")}
    for command, code in ((["plan"], 3), (["apply"], 1)):
        done = subprocess.run(
            [sys.executable, "-m", "specctl.cli", *command, str(cluster)],
            capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, env=env,
        )  # fmt: skip
        assert done.returncode == code, (command, done.stdout + done.stderr)
        assert f"{cluster}:13: models[0].path: model directory {gone} does not exist" in done.stderr
        assert f"node a: specd at {downs[0][1]} unreachable (ConnectError" in done.stderr
    # the TUI saves it all the same, saying what it could not check (it refused to)
    from tui.core.session import ConfigSession

    session = ConfigSession.open(cluster)
    saved, unchecked = session.save_checked()
    assert saved == cluster and unchecked is not None
    assert "unreachable (ConnectError" in unchecked
    answering = [downs[0], ("box", f"127.0.0.1:{specd.port}", token)]
    with pytest.raises(ConfigError) as caught:
        load_config_text(_config(answering, gone))
    assert not caught.value.unreachable, "a node said the directory is not there"


def _answering(status: int, body: bytes) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    return Handler


def test_a_server_error_or_a_proxys_page_is_no_answer_of_the_node(
    token_file: tuple[Path, str], tmp_path: Path
) -> None:
    """A specd whose own read failed (503, its JSON error) and a proxy's page (502): they say
    nothing of the model directory, as unknown as a node down."""
    servers = [
        http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        for handler in (
            _answering(503, b'{"error": "reading the directory timed out"}'),
            _answering(502, b"<html>Bad Gateway</html>"),
        )
    ]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        nodes = [
            (f"n{i}", f"127.0.0.1:{s.server_address[1]}", token_file[0])
            for i, s in enumerate(servers)
        ]
        config = load_config_text(_config(nodes, DEMO_TARGET))
        node, _, said, none_answered = first_config(config, list(config.nodes), tmp_path, 5.0)
        assert node is None and none_answered, said
        assert said[0].endswith(": reading the directory timed out")
        assert said[1].endswith(": HTTP 502, not a specd's answer")
        with pytest.raises(ConfigError) as caught:
            load_config_text(_config(nodes, tmp_path / "gone"))
        assert caught.value.unreachable
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
