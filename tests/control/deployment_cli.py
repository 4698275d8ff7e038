"""Running the real `specctl` CLI against a private `$SPECCTL_HOME`, for the apply tests."""

import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specctl.home import SpecctlHome
from tests.distributed.ray_cluster import ray_processes_under
from tests.ports import free_port as free_port  # re-exported for the tests

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_TARGET = REPO_ROOT / "packaging" / "demo-models" / "target"
DEMO_DRAFT = REPO_ROOT / "packaging" / "demo-models" / "draft"
APPLY_TIMEOUT_S = 300.0
COMMAND_TIMEOUT_S = 120.0
PROMPTS = ["def parse_args(argv):", "class Stack:\n    def push(self, item):"]
SERVED_MODEL = "demo-target"
MAX_TOKENS = 24


def local_cluster_file(
    path: Path,
    port: int,
    drafter_node: str = "drafter-node",
    k: int = 4,
    mode: str = "sync",
    models: tuple[Path, Path, str] = (DEMO_TARGET, DEMO_DRAFT, "float32"),
    tensor_parallel_size: int = 1,
) -> Path:
    """examples/local.toml's shape (two local Ray nodes, the demo pair), with absolute model
    paths, a port of the test's own and the drafter's node and k as asked. `models`: target
    and draft directories, and their dtype; `tensor_parallel_size` for both shards."""
    target, draft, dtype = models
    path.write_text(
        f"""\
[[nodes]]
name = "verifier-node"
specd = "local"

[[nodes]]
name = "drafter-node"
specd = "local"

[[models]]
name = "demo-target"
path = "{target}"
dtype = "{dtype}"

[[models]]
name = "demo-draft"
path = "{draft}"
dtype = "{dtype}"

[deployment]
name = "test-demo"

[deployment.verifier]
model = "demo-target"
nodes = ["verifier-node"]
tensor_parallel_size = {tensor_parallel_size}

[deployment.drafter]
model = "demo-draft"
node = "{drafter_node}"
tensor_parallel_size = {tensor_parallel_size}

[deployment.speculation]
k = {k}
mode = "{mode}"

[server]
host = "127.0.0.1"
port = {port}
max_batch_size = 8
"""
    )
    return path


@dataclass(slots=True)
class Cli:
    home: Path

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SPECCTL_HOME"] = str(self.home)
        for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN"):
            env.pop(name, None)
        return env

    def run(self, *argv: str, timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "specctl.cli", *argv],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def start(self, *argv: str) -> subprocess.Popen:
        """A command running, its stdout and stderr read as text lines as it goes."""
        return subprocess.Popen(
            [sys.executable, "-m", "specctl.cli", *argv],
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def apply(self, config: Path) -> subprocess.CompletedProcess:
        return self.run("apply", str(config), timeout_s=APPLY_TIMEOUT_S)

    def status(self) -> dict[str, Any]:
        """`status --json`; exit 0 where all of it serves, 3 where not (a shard loading)."""
        done = self.run("status", "--json")
        assert done.returncode in (0, 3), done.stdout + done.stderr
        report = json.loads(done.stdout)
        assert (done.returncode == 0) == report["is_healthy"], done.stdout
        return report

    def ray_root(self) -> Path:
        return SpecctlHome.resolve(self.home).ray_root

    def processes(self) -> list[int]:
        """Live processes apply started: Ray nodes (named by their root) and the server."""
        pids = ray_processes_under(self.ray_root())
        server = self.home / "server.json"
        if server.is_file():
            pid = json.loads(server.read_text())["pid"]
            if Path(f"/proc/{pid}").exists():
                pids.append(pid)
        return pids


def greedy_ids(client: Any, prompts: list[str]) -> list[list[int]]:
    """Greedy completions of `prompts` through the official openai client, as token ids."""
    got = []
    for prompt in prompts:
        out = client.completions.create(
            model=SERVED_MODEL,
            prompt=prompt,
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        assert out.usage is not None and out.usage.completion_tokens == MAX_TOKENS
        got.append(out.choices[0].token_ids)
    return got


def target_only_ids(prompts: list[str]) -> list[list[int]]:
    """`specctl generate` of the demo target alone on `prompts`, as token ids (run once per
    set of prompts in this process: greedy decoding of one model gives the same ids)."""
    return [list(ids) for ids in _target_only_ids(tuple(prompts))]


@functools.cache
def _target_only_ids(prompts: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    args = ["--target", str(DEMO_TARGET), "--max-tokens", str(MAX_TOKENS), "--ignore-eos"]
    args += ["--dtype", "float32", "--json", *[a for p in prompts for a in ("--prompt", p)]]
    done = subprocess.run(
        [sys.executable, "-m", "specctl.cli", "generate", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    return tuple(tuple(json.loads(line)["token_ids"]) for line in done.stdout.splitlines())


def openai_client(cli: Cli) -> Any:
    """The official openai client on the deployment's endpoint (no retries: a failure shows)."""
    import openai

    endpoint = cli.status()["endpoint"]
    return openai.OpenAI(base_url=endpoint, api_key="unused", timeout=60.0, max_retries=0)
