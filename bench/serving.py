"""Start and stop the servers the serving benchmark loads: `specctl serve`, and `vllm serve`
from its own venv (bench/.venv-vllm) when it exists."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.peers.vllm_runner import DEFAULT_VENV, SETUP_HINT, peer_env, venv_python

REPO = Path(__file__).resolve().parents[1]
SPECCTL_READY_TIMEOUT_S = 180.0
VLLM_READY_TIMEOUT_S = 900.0  # vLLM's CPU startup (engine core, workers) is slow on 2 cores
STOP_TIMEOUT_S = 60.0
VLLM_MEMORY_SHARE = 0.3  # on CPU: the share of RAM vLLM may reserve (as bench/peers does)
VLLM_KV_CACHE_BYTES = 1 << 30  # an explicit KV cache, so startup does not size it off RAM


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(slots=True)
class ServerSpec:
    target: Path
    draft: Path | None
    k: int
    model_name: str
    max_batch_size: int
    max_model_len: int
    dtype: str = "float32"
    threads: int = 1


class RunningServer:
    """A server subprocess in a session of its own; `stop()` ends the whole session."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.port = int(command[command.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self._log = log.open("w")
        self.process = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.process.returncode}: {self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} not ready within {timeout_s:.0f} s: {self.tail()}")

    def tail(self, num_chars: int = 1500) -> str:
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError):  # workers left in the session
            os.killpg(self.process.pid, signal.SIGKILL)
        self._log.close()


def start_specctl(spec: ServerSpec, log_dir: Path) -> RunningServer:
    command = [sys.executable, "-m", "specctl.cli", "serve", "--target", str(spec.target)]
    if spec.draft is not None:
        command += ["--draft", str(spec.draft), "-k", str(spec.k)]
    command += ["--served-model-name", spec.model_name, "--dtype", spec.dtype]
    command += ["--max-batch-size", str(spec.max_batch_size)]
    command += ["--max-model-len", str(spec.max_model_len), "--threads", str(spec.threads)]
    command += ["--port", str(free_port())]
    server = RunningServer("specctl serve", command, dict(os.environ), log_dir / "specctl.log")
    server.wait_ready(SPECCTL_READY_TIMEOUT_S)
    return server


def vllm_missing(venv: Path = DEFAULT_VENV) -> str | None:
    """Why vLLM cannot run here, or None when its venv exists."""
    if not venv_python(venv).is_file():
        return f"vLLM not run: {venv_python(venv)} is missing ({SETUP_HINT})"
    return None


def start_vllm(spec: ServerSpec, log_dir: Path, venv: Path = DEFAULT_VENV) -> RunningServer:
    """`vllm serve` on the same pair, the same k, greedy drafting from the draft model."""
    command = [str(venv_python(venv)), "-m", "vllm.entrypoints.openai.api_server"]
    command += ["--model", str(spec.target), "--served-model-name", spec.model_name]
    command += ["--dtype", spec.dtype, "--max-model-len", str(spec.max_model_len)]
    command += ["--max-num-seqs", str(spec.max_batch_size), "--enforce-eager"]
    command += ["--gpu-memory-utilization", str(VLLM_MEMORY_SHARE)]
    command += ["--kv-cache-memory-bytes", str(VLLM_KV_CACHE_BYTES)]
    command += ["--host", "127.0.0.1", "--port", str(free_port())]
    if spec.draft is not None:
        speculative = {"method": "draft_model", "model": str(spec.draft)}
        speculative["num_speculative_tokens"] = spec.k  # type: ignore[assignment]
        command += ["--speculative-config", json.dumps(speculative)]
    env = peer_env(venv)
    env["OMP_NUM_THREADS"] = str(spec.threads)
    server = RunningServer("vllm serve", command, env, log_dir / "vllm.log")
    server.wait_ready(VLLM_READY_TIMEOUT_S)
    return server
