"""`specctl apply / status / down` end to end, from a fresh `$SPECCTL_HOME`: two local Ray
nodes, the demo pair, the serving process, the official openai client, the metrics history
read from another process while requests run, a second apply that changes nothing, a changed
k that changes only that, and a down that leaves no process behind."""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from db import Store
from specctl.apply.shards import VERIFIER_RESTARTS
from specctl.deploy.remote_backend import CALL_TIMEOUT_S as REMOTE_CALL_S
from specctl.home import SpecctlHome
from tests.distributed.ray_cluster import ray_processes_under, raylet_pids

from .deployment_cli import (
    APPLY_TIMEOUT_S,
    DEMO_TARGET,
    PROMPTS,
    SERVED_MODEL,
    Cli,
    free_port,
    greedy_ids,
    local_cluster_file,
    openai_client,
    target_only_ids,
)

# Where the drafter goes. On the verifier's node, the verifier runs the draft model in its own
# process (no drafter shard); on drafter-node, a drafter shard of its own serves it remotely.
DRAFTER_NODE = "drafter-node"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cli, Path]]:
    root = tmp_path_factory.mktemp("apply")
    cli = Cli(root / "home")
    config = local_cluster_file(root / "cluster.toml", free_port(), drafter_node=DRAFTER_NODE)
    done = cli.apply(config)
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        yield cli, config
    finally:
        cli.run("down", timeout_s=180)
        leftover = cli.processes()
        assert not leftover, f"processes left after down: {leftover}"


def test_apply_prints_the_endpoint_and_status_shows_the_shards(
    deployment: tuple[Cli, Path],
) -> None:
    cli, _ = deployment
    status = cli.status()
    assert status["endpoint"].startswith("http://127.0.0.1:") and status["endpoint"].endswith("/v1")
    assert status["server_status"] == "ready" and status["is_server_alive"]
    by_role = {s["role"]: s for s in status["shards"]}
    assert by_role["verifier"]["node"] == "verifier-node"
    if DRAFTER_NODE == "verifier-node":
        assert set(by_role) == {"verifier"}
    else:
        assert set(by_role) == {"drafter", "verifier"}
        assert by_role["drafter"]["node"] == DRAFTER_NODE
    for shard in status["shards"]:  # each reports running where the plan put it
        assert shard["state"] == "ready" and shard["running_on"] == shard["node"], shard
    assert status["is_healthy"]
    health = httpx.get(status["endpoint"].removesuffix("/v1") + "/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ready"


def test_openai_client_greedy_equals_generate_target_only(deployment: tuple[Cli, Path]) -> None:
    cli, _ = deployment
    client = openai_client(cli)
    assert greedy_ids(client, PROMPTS) == target_only_ids(PROMPTS)
    chat = client.chat.completions.create(
        model=SERVED_MODEL, messages=[{"role": "user", "content": "def f(x):"}], max_tokens=8
    )
    assert chat.choices[0].message.content is not None


def test_history_is_written_while_another_process_reads_it(deployment: tuple[Cli, Path]) -> None:
    """The serving process writes samples and request records; a reader in another process
    (this one) polls the same file meanwhile and never meets "database is locked"."""
    cli, _ = deployment
    client = openai_client(cli)
    state = json.loads((cli.home / "state.json").read_text())
    deployment_id = state["deployment_id"]
    db_path = Path(state["db_path"])
    started = time.time()
    errors: list[str] = []

    def load() -> None:
        try:
            for i in range(6):
                client.completions.create(
                    model=SERVED_MODEL, prompt=PROMPTS[i % 2], max_tokens=16, temperature=0
                )
        except Exception as exc:
            errors.append(repr(exc))

    workers = [threading.Thread(target=load) for _ in range(2)]
    for worker in workers:
        worker.start()
    num_reads = 0
    with Store.open(db_path, role="reader") as store:
        while any(w.is_alive() for w in workers):
            store.samples_since(deployment_id, started)  # raises on "database is locked"
            num_reads += 1
            time.sleep(0.05)
        for worker in workers:
            worker.join(120)
        time.sleep(2.5)  # the writer flushes once a second
        samples = store.samples_since(deployment_id, started)
        requests = store.recent_requests(deployment_id, limit=50)
        node_names = {node.name for node in store.nodes()}
        memory = store.gpu_samples_since(started - 10)
    assert not errors, errors
    assert num_reads > 5
    busy = [s for s in samples if s.tokens_per_s > 0]
    assert busy and any(s.acceptance_rate is not None for s in busy)
    assert sum(1 for r in requests if r.finished_unix_s >= started) >= 12
    assert {"verifier-node", "drafter-node"} <= node_names  # read by the serving process
    assert memory and all(s.gpu_index == -1 for s in memory)  # CPU nodes: memory in use
    with sqlite3.connect(db_path) as raw:  # WAL, as the store promises
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_second_apply_changes_nothing(deployment: tuple[Cli, Path]) -> None:
    cli, config = deployment
    before = cli.status()
    done = cli.apply(config)
    assert done.returncode == 0, done.stderr
    assert "changed: nothing" in done.stdout
    after = cli.status()
    assert after["server_pid"] == before["server_pid"]
    assert [s["pid"] for s in after["shards"]] == [s["pid"] for s in before["shards"]]


def test_changed_k_changes_only_the_speculation(deployment: tuple[Cli, Path]) -> None:
    cli, config = deployment
    before = cli.status()
    text = config.read_text()
    config.write_text(text.replace("k = 4", "k = 2"))
    try:
        done = cli.apply(config)
        assert done.returncode == 0, done.stderr
        assert "speculation changed live" in done.stderr
        assert "changed: nothing" not in done.stdout  # the summary names the live change
        assert "speculation k=2, adaptive off" in done.stdout, done.stdout
        after = cli.status()
        assert after["server_pid"] == before["server_pid"]
        assert [s["pid"] for s in after["shards"]] == [s["pid"] for s in before["shards"]]
        out = openai_client(cli).completions.create(
            model=SERVED_MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0
        )
        assert out.usage is not None and out.usage.completion_tokens == 8
        # the server, not restarted, writes its history under the deployment id it started
        # with: status reads that one (a new id was recorded, and status found no samples)
        deadline = time.monotonic() + 15
        while cli.status()["live"] is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert cli.status()["live"] is not None
    finally:
        config.write_text(text)


def test_a_k_changed_live_is_restored_after_the_verifier_restarts(
    deployment: tuple[Cli, Path],
) -> None:
    """Ray restarts a dead verifier with the settings it was created with: apply compares
    what it runs, not what it recorded (it said "already running" over the old k)."""
    cli, config = deployment
    text = config.read_text()
    config.write_text(text.replace("k = 4", "k = 2"))
    try:
        assert cli.apply(config).returncode == 0
        verifier = next(s for s in cli.status()["shards"] if s["role"] == "verifier")
        os.kill(verifier["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            now = next(s for s in cli.status()["shards"] if s["role"] == "verifier")
            if now["state"] == "ready" and now["pid"] not in (None, verifier["pid"]):
                break
            time.sleep(1)
        else:
            raise AssertionError(f"the verifier was not restarted: {cli.status()['shards']}")
        done = cli.apply(config)
        assert done.returncode == 0, done.stderr
        assert "speculation restored live" in done.stderr, done.stderr
        again = cli.apply(config)
        assert "changed: nothing" in again.stdout, again.stdout + again.stderr
    finally:
        config.write_text(text)
        assert cli.apply(config).returncode == 0


def test_a_move_to_a_taken_port_leaves_the_endpoint_serving(
    deployment: tuple[Cli, Path],
) -> None:
    """The working server was stopped first, then the new one could not bind: no endpoint."""
    cli, config = deployment
    before = cli.status()
    text = config.read_text()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config.write_text(re.sub(r"port = \d+", f"port = {port}", text, count=1))
        try:
            done = cli.apply(config)
        finally:
            config.write_text(text)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"cannot serve on 127.0.0.1:{port}" in done.stderr
    after = cli.status()
    assert after["endpoint"] == before["endpoint"]
    assert after["server_pid"] == before["server_pid"]
    out = openai_client(cli).completions.create(
        model=SERVED_MODEL, prompt=PROMPTS[0], max_tokens=4, temperature=0
    )
    assert out.usage is not None and out.usage.completion_tokens == 4


def test_a_changed_model_that_would_not_load_leaves_the_verifier_serving(
    deployment: tuple[Cli, Path], tmp_path: Path
) -> None:
    """A new target path whose weights file was cut short: apply stopped the serving verifier,
    then the new one failed to load, and no request could be served. Now the new model is
    checked on its node first, and nothing is stopped; a good one replaces the verifier."""
    cli, config = deployment
    before = cli.status()
    text = config.read_text()
    copy = Path(shutil.copytree(DEMO_TARGET, tmp_path / "target-copy"))
    weights = copy / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    config.write_text(text.replace(f'path = "{DEMO_TARGET}"', f'path = "{copy}"'))
    try:
        done = cli.apply(config)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "no running shard was stopped, and they keep serving" in done.stderr, done.stderr
        said = f"verifier r0 on verifier-node: {weights}: cannot open safetensors file"
        assert said in done.stderr, done.stderr
        after = cli.status()
        assert [s["pid"] for s in after["shards"]] == [s["pid"] for s in before["shards"]]
        assert after["server_pid"] == before["server_pid"]
        assert cli.run("status").returncode == 0
        out = openai_client(cli).completions.create(
            model=SERVED_MODEL, prompt=PROMPTS[0], max_tokens=4, temperature=0
        )
        assert out.usage is not None and out.usage.completion_tokens == 4
        weights.write_bytes(whole)  # the same model, whole: it is checked, then replaces
        done = cli.apply(config)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "model directories would load" in done.stderr, done.stderr
        assert _verifier(cli)["pid"] != _verifier_of(before)["pid"]
        assert greedy_ids(openai_client(cli), PROMPTS[:1]) == target_only_ids(PROMPTS[:1])
    finally:
        config.write_text(text)
        assert cli.apply(config).returncode == 0


def test_a_model_that_fails_to_load_after_the_check_is_rolled_back(
    deployment: tuple[Cli, Path], tmp_path: Path
) -> None:
    """The verifier moves to a node added by the same file, with a new target that passes
    the check there; then its weights file is cut short (a sync still writing it) before the
    new verifier loads it. The serving verifier is stopped by then, and the load fails: apply
    used to leave no endpoint (and the added node running, listed nowhere). Now it starts the
    last good apply's verifier again, stops the node it had added, says so, and fails; the
    same serving process serves again."""
    cli, config = deployment
    before = cli.status()
    text = config.read_text()
    weights, spare = _verifier_moved_to_a_new_node(cli, config, tmp_path)
    try:
        code, steps, said = _apply_cutting(cli, config, weights, ("check models", "done"))
        assert code == 1, said
        named = [(r.get("name"), r.get("state")) for r in steps]
        assert ("check models", "done") in named, said  # the check passed: the cut came after
        assert ("verifier r0", "failed") in named, said
        assert ("rollback", "done") in named, said
        rolled = next(r for r in steps if r.get("name") == "rollback" and r["state"] == "done")
        assert "stopped the nodes the failed apply had added: spare-node" in rolled["detail"]
        outcome = steps[-1]
        assert outcome["kind"] == "outcome" and not outcome["is_ok"], said
        assert "failed to load" in outcome["message"], said
        assert "were started again and serve" in outcome["message"], said
        assert ray_processes_under(spare) == [], "the node the failed apply added is stopped"
        # the serving process's shard watcher looks every few seconds: it last saw the
        # verifier loading, or not at all
        deadline = time.monotonic() + 30
        while not (after := cli.status())["is_healthy"]:
            assert time.monotonic() < deadline, json.dumps(after["shards"])
            time.sleep(0.5)
        assert after["server_pid"] == before["server_pid"]
        assert [n["name"] for n in after["nodes"]] == [n["name"] for n in before["nodes"]]
        assert _verifier_of(after)["running_on"] == "verifier-node"
        assert _verifier(cli)["pid"] != _verifier_of(before)["pid"]
        drafters = [s["pid"] for s in after["shards"] if s["role"] == "drafter"]
        assert drafters == [s["pid"] for s in before["shards"] if s["role"] == "drafter"]
        assert greedy_ids(openai_client(cli), PROMPTS[:1]) == target_only_ids(PROMPTS[:1])
    finally:
        config.write_text(text)
    _runs_already(cli, config)  # the last good file again


def test_a_failed_load_in_an_apply_that_restarted_the_head_is_rolled_back(
    deployment: tuple[Cli, Path], tmp_path: Path
) -> None:
    """The head's raylet died, and the file changes the target: the apply starts the head
    anew (a new GCS: every shard and the serving process replaced; nothing runs, so no
    model is checked first), and the new target is cut short as its verifier starts. The
    rollback deploys the last good shards on the new cluster, with a serving process that
    joined it: the endpoint serves again."""
    cli, config = deployment
    before = cli.status()
    text = config.read_text()
    copy = Path(shutil.copytree(DEMO_TARGET, tmp_path / "target-copy"))
    weights = copy / "model.safetensors"
    config.write_text(text.replace(f'path = "{DEMO_TARGET}"', f'path = "{copy}"'))
    (raylet,) = raylet_pids(cli.ray_root() / "verifier-node")  # the head
    os.kill(raylet, signal.SIGKILL)
    try:
        code, steps, said = _apply_cutting(cli, config, weights, ("verifier r0", "started"))
        assert code == 1, said
        named = [(r.get("name"), r.get("state")) for r in steps]
        assert ("verifier r0", "failed") in named, said
        assert ("rollback", "done") in named, said
        outcome = steps[-1]
        assert "were started again and serve" in outcome["message"], said
        deadline = time.monotonic() + 60
        while not (after := cli.status())["is_healthy"]:
            assert time.monotonic() < deadline, json.dumps(after)
            time.sleep(0.5)
        assert after["server_pid"] != before["server_pid"], "the old server held the dead GCS"
        assert greedy_ids(openai_client(cli), PROMPTS[:1]) == target_only_ids(PROMPTS[:1])
    finally:
        config.write_text(text)
    _runs_already(cli, config)  # the last good file again


def test_a_failed_load_after_a_head_restart_and_a_node_added_is_rolled_back(
    deployment: tuple[Cli, Path], tmp_path: Path
) -> None:
    """Both at once: the head's raylet died, and the file moves the verifier, with a new
    target, to a node it adds. The apply starts the head anew and the added node on it; the
    new target is cut short as its verifier starts. The rollback deploys the last good shards
    on the new cluster and stops the node the failed apply added: the endpoint serves again,
    on the nodes it had before. The apply is a watch's first, asked to stop (by `specctl
    down`, its service stopped) as the cut is made: it exits 5, which its service does not
    start again, and no watch is left."""
    cli, config = deployment
    before = cli.status()
    text = config.read_text()
    weights, spare = _verifier_moved_to_a_new_node(cli, config, tmp_path)
    (raylet,) = raylet_pids(cli.ray_root() / "verifier-node")  # the head
    os.kill(raylet, signal.SIGKILL)
    try:
        at = ("verifier r0", "started")
        code, steps, said = _apply_cutting(cli, config, weights, at, "--watch", "1")
        assert code == 5, said
        named = [(r.get("name"), r.get("state")) for r in steps]
        assert ("verifier r0", "failed") in named, said
        assert ("rollback", "done") in named, said
        rolled = next(r for r in steps if r.get("name") == "rollback" and r["state"] == "done")
        assert "stopped the nodes the failed apply had added: spare-node" in rolled["detail"]
        assert "were started again and serve" in steps[-1]["message"], said
        assert ray_processes_under(spare) == [], "the node the failed apply added is stopped"
        deadline = time.monotonic() + 60
        while not (after := cli.status())["is_healthy"]:
            assert time.monotonic() < deadline, json.dumps(after)
            time.sleep(0.5)
        assert after["server_pid"] != before["server_pid"], "the old server held the dead GCS"
        assert [n["name"] for n in after["nodes"]] == [n["name"] for n in before["nodes"]]
        assert _verifier_of(after)["running_on"] == "verifier-node"
        assert after["watch"] is None
        assert greedy_ids(openai_client(cli), PROMPTS[:1]) == target_only_ids(PROMPTS[:1])
    finally:
        config.write_text(text)
    _runs_already(cli, config)  # the last good file again


def _verifier_moved_to_a_new_node(cli: Cli, config: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Write `config` to move the verifier, with a copy of the target, to a node it adds
    ("spare-node"); the copy's weights file (to cut) and the new node's Ray root."""
    text = config.read_text()
    copy = Path(shutil.copytree(DEMO_TARGET, tmp_path / "target-copy"))
    changed = text.replace(f'path = "{DEMO_TARGET}"', f'path = "{copy}"')
    changed = changed.replace('nodes = ["verifier-node"]', 'nodes = ["spare-node"]')
    node = '[[nodes]]\nname = "spare-node"\nspecd = "local"\n\n[[models]]'
    config.write_text(changed.replace("[[models]]", node, 1))
    return copy / "model.safetensors", cli.ray_root() / "spare-node"


def _runs_already(cli: Cli, config: Path) -> None:
    done = cli.apply(config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "changed: nothing" in done.stdout, done.stdout + done.stderr


def _apply_cutting(
    cli: Cli, config: Path, weights: Path, at: tuple[str, str], *watch: str
) -> tuple[int, list[dict], str]:
    """`apply --json` of `config`, `weights` cut in half (a sync still writing them) as the
    step `at` (name, state) is said: its exit code, its JSON records, and all it said.
    `watch`: ("--watch", SECONDS), and the watch is asked to stop (SIGTERM) at the cut."""
    applying = cli.start("apply", "--json", *watch, str(config))
    watchdog = threading.Timer(APPLY_TIMEOUT_S, applying.kill)
    watchdog.start()
    steps: list[dict] = []
    try:
        assert applying.stdout is not None
        for line in applying.stdout:
            record = json.loads(line)
            steps.append(record)
            if (record.get("name"), record.get("state")) == at:
                weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
                if watch:
                    applying.send_signal(signal.SIGTERM)
        stderr = applying.stderr.read() if applying.stderr else ""
        code = applying.wait(timeout=30)
    finally:
        watchdog.cancel()
    return code, steps, "\n".join([*(json.dumps(r) for r in steps), stderr])


def _drafted(cli: Cli) -> float:
    """The serving process's count of draft tokens (its Prometheus metrics)."""
    text = httpx.get(cli.status()["endpoint"].removesuffix("/v1") + "/metrics", timeout=10).text
    match = re.search(r"^vllm:spec_decode_num_draft_tokens_total\{[^}]*\} (\S+)$", text, re.M)
    assert match, text[:2000]
    return float(match.group(1))


def test_a_frozen_drafter_slows_requests_but_never_stops_them(
    deployment: tuple[Cli, Path],
) -> None:
    """The drafter's process stopped (SIGSTOP: a node that hangs, not one that dies): the
    verifier's calls to it time out, it decodes alone, with the same output; status says the
    drafter is unreachable while /health, which only a verifier can fail, stays 200. Once
    the process runs again, speculation resumes."""
    cli, _ = deployment
    health_url = cli.status()["endpoint"].removesuffix("/v1") + "/health"
    drafter = next(s for s in cli.status()["shards"] if s["role"] == "drafter")
    os.kill(drafter["pid"], signal.SIGSTOP)
    try:
        assert greedy_ids(openai_client(cli), PROMPTS[:1]) == target_only_ids(PROMPTS[:1])
        states = {s["role"]: s["state"] for s in cli.status()["shards"]}
        assert states == {"verifier": "ready", "drafter": "unreachable"}, states
        assert cli.run("status").returncode == 3
        assert httpx.get(health_url, timeout=10).status_code == 200
    finally:
        os.kill(drafter["pid"], signal.SIGCONT)
    before = _drafted(cli)
    deadline = time.monotonic() + 60  # the verifier probes a lost drafter now and then
    while _drafted(cli) == before:
        assert time.monotonic() < deadline, "speculation did not resume"
        out = openai_client(cli).completions.create(
            model=SERVED_MODEL, prompt=PROMPTS[1], max_tokens=16, temperature=0
        )
        assert out.usage is not None and out.usage.completion_tokens == 16
    deadline = time.monotonic() + 30
    while cli.run("status").returncode != 0:
        assert time.monotonic() < deadline, cli.status()["shards"]
        time.sleep(0.5)


def test_apply_replaces_a_frozen_drafter(deployment: tuple[Cli, Path]) -> None:
    """A drafter whose process is stopped answers no status: apply takes it for down (within
    its status timeout, not waiting for ever) and replaces it; the verifier is kept."""
    cli, config = deployment
    before = cli.status()
    drafter = next(s for s in before["shards"] if s["role"] == "drafter")
    os.kill(drafter["pid"], signal.SIGSTOP)
    try:
        done = cli.apply(config)
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed by the apply, as it should be
            os.kill(drafter["pid"], signal.SIGCONT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "drafter r0 on drafter-node" in done.stderr, done.stderr
    after = cli.status()
    assert _verifier_of(after)["pid"] == _verifier_of(before)["pid"]
    now = next(s for s in after["shards"] if s["role"] == "drafter")
    assert now["pid"] != drafter["pid"]
    deadline = time.monotonic() + 30  # Ray kills the old process as it gets to it
    while Path(f"/proc/{drafter['pid']}").exists():
        assert time.monotonic() < deadline, "the frozen drafter's process was left running"
        time.sleep(0.2)
    while cli.run("status").returncode != 0:
        assert time.monotonic() < deadline, cli.status()["shards"]
        time.sleep(0.5)


def test_a_frozen_verifier_fails_requests_in_time_and_serves_again_once_it_runs(
    deployment: tuple[Cli, Path],
) -> None:
    """The verifier's process stopped (a hung node): a request in flight ends with an error
    within the backend's call timeout rather than waiting for ever, /health says degraded;
    once the process runs again the same shard serves, with no apply."""
    cli, _ = deployment
    endpoint = cli.status()["endpoint"]
    health_url = endpoint.removesuffix("/v1") + "/health"
    verifier = _verifier(cli)
    body = {"model": SERVED_MODEL, "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0}
    os.kill(verifier["pid"], signal.SIGSTOP)
    try:
        started = time.monotonic()
        response = httpx.post(f"{endpoint}/completions", json=body, timeout=REMOTE_CALL_S + 60)
        took = time.monotonic() - started
        assert response.status_code >= 500, response.text
        assert "error" in response.json(), response.text
        assert took < REMOTE_CALL_S + 30, f"the request waited {took:.0f} s"
        deadline = time.monotonic() + 30  # the server looks at its shards every 2 s
        while (health := httpx.get(health_url, timeout=10)).status_code == 200:
            assert time.monotonic() < deadline, health.text
            time.sleep(0.5)
        assert health.status_code == 503 and health.json()["status"] == "degraded", health.text
    finally:
        os.kill(verifier["pid"], signal.SIGCONT)
    deadline = time.monotonic() + 60
    while (response := httpx.post(f"{endpoint}/completions", json=body, timeout=90)).is_error:
        assert time.monotonic() < deadline, response.text
        time.sleep(1)
    assert response.json()["usage"]["completion_tokens"] == 8
    assert _verifier(cli)["pid"] == verifier["pid"]  # the same process, not a restart
    deadline = time.monotonic() + 30
    while httpx.get(health_url, timeout=10).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.5)


def test_a_node_added_then_removed_is_started_then_stopped(
    deployment: tuple[Cli, Path],
) -> None:
    cli, config = deployment
    before = cli.status()
    text = config.read_text()
    spare = cli.ray_root() / "spare-node"
    config.write_text(
        text.replace(
            "[[models]]", '[[nodes]]\nname = "spare-node"\nspecd = "local"\n\n[[models]]', 1
        )
    )
    try:
        done = cli.apply(config)
        assert done.returncode == 0, done.stderr
        assert ray_processes_under(spare), "the added node runs"
        assert [n["name"] for n in cli.status()["nodes"]][-1] == "spare-node"
    finally:
        config.write_text(text)
    done = cli.apply(config)
    assert done.returncode == 0, done.stderr
    assert "stopped nodes no longer listed: spare-node" in done.stderr
    assert ray_processes_under(spare) == []
    after = cli.status()
    assert [s["pid"] for s in after["shards"]] == [s["pid"] for s in before["shards"]]
    assert after["server_pid"] == before["server_pid"]


def _verifier(cli: Cli) -> dict:
    return _verifier_of(cli.status())


def _verifier_of(status: dict) -> dict:
    return next(s for s in status["shards"] if s["role"] == "verifier")


def test_a_verifier_gone_for_good_fails_health_until_apply_replaces_it(
    deployment: tuple[Cli, Path],
) -> None:
    """/health said ready, and `status` exited 0, while every request got a 503: the
    verifier had died more often than Ray restarts it."""
    cli, config = deployment
    health_url = cli.status()["endpoint"].removesuffix("/v1") + "/health"
    killed: set[int] = set()
    for _ in range(VERIFIER_RESTARTS + 1):  # fewer where an earlier test used some up
        deadline = time.monotonic() + 120
        while True:
            shard = _verifier(cli)
            ready = shard["state"] == "ready" and shard["pid"] not in killed
            if ready or shard["error"] == "no such actor":
                break
            assert time.monotonic() < deadline, shard
            time.sleep(0.5)
        if not ready:
            break
        killed.add(shard["pid"])
        os.kill(shard["pid"], signal.SIGKILL)
    assert killed
    deadline = time.monotonic() + 60
    while (health := httpx.get(health_url, timeout=10)).status_code == 200:
        assert time.monotonic() < deadline, "the verifier came back: Ray restarted it again"
        time.sleep(1)
    assert health.status_code == 503, health.text
    assert health.json()["status"] == "degraded"
    assert "no replica can serve: test-demo.r0.verifier" in health.json()["error"]
    done = cli.run("status")
    assert done.returncode == 3, done.stdout + done.stderr
    done = cli.apply(config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verifier r0 on verifier-node" in done.stderr, done.stderr
    deadline = time.monotonic() + 30  # the server looks at its shards every 2 s
    while cli.run("status").returncode != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cli.status()["is_healthy"]
    assert httpx.get(health_url, timeout=10).status_code == 200
    out = openai_client(cli).completions.create(
        model=SERVED_MODEL, prompt=PROMPTS[0], max_tokens=4, temperature=0
    )
    assert out.usage is not None and out.usage.completion_tokens == 4


@pytest.mark.parametrize(
    ("node", "said"),
    [
        (DRAFTER_NODE, "drafter r0 on drafter-node (its Ray restarted)"),
        ("verifier-node", "server replacing the serving process"),  # the head: a new GCS
    ],
)
def test_a_node_whose_raylet_died_is_started_again(
    deployment: tuple[Cli, Path], node: str, said: str
) -> None:
    """A raylet killed under its node: the node's log monitor outlived it, the node counted
    as running, apply's start was a no-op, and apply waited out its timeout for a drafter
    that could not be placed. Now the node is found dead, its remnants ended, and it starts
    again with the shards it held; where it was the head, with every node and shard of the
    new GCS, and a serving process that joined it (the old one answered 503s)."""
    cli, config = deployment
    node_root = cli.ray_root() / node
    (raylet,) = raylet_pids(node_root)
    os.kill(raylet, signal.SIGKILL)
    started = time.monotonic()
    done = cli.apply(config)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(now := raylet_pids(node_root)) == 1 and now[0] != raylet
    assert said in done.stderr, done.stderr
    deadline = time.monotonic() + 30  # the server watches its shards every 2 s
    while True:
        status = cli.status()
        states = [(s["id"], s["state"], s["pid"], s["error"]) for s in status["shards"]]
        if all(s[1] == "ready" for s in states) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert status["problems"] == [], status["problems"]
    assert all(s[1] == "ready" for s in states), f"{states}\n{done.stderr}"
    out = openai_client(cli).completions.create(
        model=SERVED_MODEL, prompt=PROMPTS[0], max_tokens=4, temperature=0
    )
    assert out.usage is not None and out.usage.completion_tokens == 4
    assert took < 200, f"apply took {took:.0f} s"
    again = cli.apply(config)
    assert "changed: nothing" in again.stdout, again.stdout + again.stderr


def test_apply_watch_repairs_a_dead_raylet_and_stops_when_asked(
    deployment: tuple[Cli, Path],
) -> None:
    """A raylet killed under the drafter's node: nothing repaired it until someone applied.
    `apply --watch` does: it looks every second, finds the drafter gone, applies again what
    was applied (the node and its drafter start again), and at SIGTERM stops watching with
    the deployment running. The file edited meanwhile is said, not applied."""
    cli, config = deployment
    text = config.read_text()
    watching = cli.start("apply", "--json", "--watch", "1", str(config))
    records: list[dict] = []
    not_json: list[str] = []  # --json promises JSON lines on stdout, and nothing else

    def read() -> None:
        assert watching.stdout is not None
        for line in watching.stdout:
            try:
                records.append(json.loads(line))
            except ValueError:
                not_json.append(line)

    errors: list[str] = []  # read as it comes: a full pipe would stop the watch
    readers = [
        threading.Thread(target=read, daemon=True),
        threading.Thread(target=lambda: errors.extend(watching.stderr or []), daemon=True),
    ]
    for reader in readers:
        reader.start()

    def watch_steps(state: str) -> list[str]:
        return [
            r["detail"] for r in list(records) if r.get("name") == "watch" and r["state"] == state
        ]

    def wait_for(what: str, condition: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert watching.poll() is None, f"the watch ended: {records} {''.join(errors)}"
            assert time.monotonic() < deadline, f"{what}: {records} {not_json}"
            time.sleep(0.5)

    node_root = cli.ray_root() / DRAFTER_NODE
    try:
        wait_for(
            "watching", lambda: any("looking every 1 s" in d for d in watch_steps("started")), 120
        )
        assert any(r.get("kind") == "outcome" and r["is_ok"] for r in records), records
        seen = cli.status()["watch"]
        assert seen is not None and seen["pid"] == watching.pid and seen["interval_s"] == 1
        from tui.core.status import read_deployment_status  # the TUI's Launch screen says so

        shown = read_deployment_status(SpecctlHome(cli.home)).summary()
        assert f"\nkept running by a watch: pid {watching.pid}, every 1 s since " in shown
        second = cli.run("apply", "--json", "--watch", "5", str(config))
        assert second.returncode == 4, second.stdout + second.stderr
        assert f"a watch already keeps this home's deployment running (pid {watching.pid}, " in (
            second.stderr
        )
        said = [json.loads(line) for line in second.stdout.splitlines()]
        assert [r["kind"] for r in said] == ["outcome"], "refused, but it applied first"
        config.write_text(text + "# edited while watched\n")
        (raylet,) = raylet_pids(node_root)
        drafter = next(s for s in cli.status()["shards"] if s["role"] == "drafter")
        os.kill(raylet, signal.SIGKILL)
        wait_for(
            "repaired", lambda: any(d.startswith("repaired") for d in watch_steps("done")), 300
        )
        assert any(d.startswith("repairing: ") and "drafter" in d for d in watch_steps("started"))
        assert any("changed since it was applied" in d for d in watch_steps("skipped"))
        assert len(now := raylet_pids(node_root)) == 1 and now[0] != raylet
        deadline = time.monotonic() + 30  # the server's shard watcher looks every 2 s
        while not (status := cli.status())["is_healthy"]:
            assert time.monotonic() < deadline, status
            time.sleep(0.5)
        now_drafter = next(s for s in status["shards"] if s["role"] == "drafter")
        assert now_drafter["pid"] != drafter["pid"]
        assert status["watch"]["repairs"] >= 1 and status["watch"]["last_outcome"] == "repaired"
        shown = cli.run("status").stdout
        shown = shown.replace("\n", " ")  # (a narrow terminal wraps the line)
        assert f"watch      pid {watching.pid}, every 1 s since " in shown and " repair" in shown
        applied = json.loads((cli.home / "state.json").read_text())["config_text"]
        assert applied == text, "the watch applied the edited file"
        assert greedy_ids(openai_client(cli), PROMPTS[:1]) == target_only_ids(PROMPTS[:1])
    finally:
        config.write_text(text)
        watching.send_signal(signal.SIGTERM)
        try:
            code = watching.wait(timeout=120)
        except subprocess.TimeoutExpired:
            watching.kill()  # it would go on repairing under the next tests
            raise
        for reader in readers:
            reader.join(timeout=10)
    assert code == 0, f"{records}\n{''.join(errors)[-3000:]}"
    assert not_json == [], not_json
    assert watch_steps("done")[-1] == "stopped watching; the deployment is left as it is"
    after = cli.status()
    assert after["is_healthy"] and after["watch"] is None
    assert not (cli.home / "watch.json").exists()


def test_sigterm_during_a_watchs_first_apply_lets_that_apply_finish(
    deployment: tuple[Cli, Path],
) -> None:
    """The service running a watch is stopped while its first apply runs (at boot, say):
    that apply finishes (what it started is recorded, for `down` to find), then the watch
    ends at once, exit 0. It was killed mid-apply."""
    cli, config = deployment
    watching = cli.start("apply", "--json", "--watch", "1", str(config))
    assert watching.stdout is not None
    first = watching.stdout.readline()  # the apply has begun: "validate" started
    watching.send_signal(signal.SIGTERM)
    try:
        out, err = watching.communicate(timeout=APPLY_TIMEOUT_S)
    finally:
        watching.kill()
    assert watching.returncode == 0, err[-3000:]
    records = [json.loads(line) for line in (first + out).splitlines()]
    assert records[0]["name"] == "validate", records
    assert any(r.get("kind") == "outcome" and r["is_ok"] for r in records), records
    watched = [r["detail"] for r in records if r.get("name") == "watch"]
    assert watched == ["stopped before watching; the deployment is left as it is"], watched
    after = cli.status()
    assert after["is_healthy"] and after["watch"] is None


def test_down_leaves_no_process(deployment: tuple[Cli, Path]) -> None:
    """...and stops an `apply --watch` watching it first (left running, it would keep an
    apply made after the down), which neither repairs what down stops nor applies it again."""
    cli, config = deployment
    status = cli.status()
    pids = [status["server_pid"], *(s["pid"] for s in status["shards"])]
    assert cli.processes() and all(Path(f"/proc/{pid}").exists() for pid in pids)
    watching = cli.start("apply", "--json", "--watch", "1", str(config))
    try:
        assert watching.stdout is not None
        for line in watching.stdout:  # the apply's outcome, then the watch looks
            if json.loads(line).get("name") == "watch":
                break
        done = cli.run("down", "--json", timeout_s=180)
        said, errors = watching.communicate(timeout=10)  # it let the home go: it is ending
    finally:
        if watching.poll() is None:
            watching.kill()
    assert watching.returncode == 0, said + errors
    assert "stopped watching; the deployment is left as it is" in said, said + errors
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [json.loads(line) for line in done.stdout.splitlines()]
    watch_step = [(s["state"], s["detail"]) for s in steps if s.get("name") == "watch"]
    assert watch_step == [("done", f"the watch (pid {watching.pid}) stopped")], steps
    assert cli.processes() == []
    assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []
    assert not (cli.home / "state.json").exists()
    again = cli.run("down")  # nothing left to stop: still fine
    assert again.returncode == 0, again.stderr


def test_status_without_a_deployment_says_so(tmp_path: Path) -> None:
    done = Cli(tmp_path / "empty-home").run("status", "--json")
    assert done.returncode == 1
    assert "nothing applied" in json.loads(done.stdout)["problems"][0]
