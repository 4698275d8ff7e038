"""A real `specctl serve` in a subprocess on a free loopback port, for the tests.

The process runs in a session of its own, so `close()` can check that nothing it started is
left behind, and kill the whole session as a backstop if it did not stop by itself.
"""

import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from daemon.specd.process_tree import end_session, session_pids
from tests.ports import free_port as free_port  # re-exported for the tests

REPO = Path(__file__).resolve().parents[2]
DEMO_TARGET = REPO / "packaging" / "demo-models" / "target"
DEMO_DRAFT = REPO / "packaging" / "demo-models" / "draft"
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 120.0
POLL_S = 0.05


def write_key_file(directory: Path, key: str) -> Path:
    path = directory / "api.key"
    path.write_text(key + "\n")
    path.chmod(0o600)
    return path


class ServeProcess:
    def __init__(self, *args: str | Path, api_key: str | None = None) -> None:
        self.work_dir = Path(tempfile.mkdtemp(prefix="serve-t-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        command = [sys.executable, "-m", "specctl.cli", "serve", *map(str, args)]
        command += ["--port", str(self.port), "--threads", "1"]  # 2 cores shared with the tests
        if api_key is not None:
            command += ["--api-key-file", str(write_key_file(self.work_dir, api_key))]
        self.log_path = self.work_dir / "serve.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.url, timeout=HTTP_TIMEOUT_S, headers=headers)
        self.health_seen: list[tuple[int, str]] = []  # (status, body["status"]) while starting
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"specctl serve exited {self.process.returncode}: {self.log()}")
            with contextlib.suppress(httpx.TransportError):
                response = self.client.get("/health", timeout=2)
                self.health_seen.append((response.status_code, response.json().get("status")))
                if response.status_code == 200:
                    return
            time.sleep(POLL_S)
        self.close()
        raise RuntimeError(f"specctl serve not ready in {READY_TIMEOUT_S} s: {self.log()}")

    def log(self, num_chars: int = 5000) -> str:
        """The end of the server's output (all of it with num_chars=0)."""
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics as {'name{labels}': value} (labels as exposed)."""
        text = self.client.get("/metrics").text
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                samples[key] = float(value)
        return samples

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for key, value in self.metrics().items():
            metric, _, rest = key.partition("{")
            found = dict(re.findall(r'(\w+)="([^"]*)"', rest))
            if metric == name and all(found.get(k) == v for k, v in labels.items()):
                total += value
        return total

    def wait_for(self, predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, f"{what} not within {timeout_s} s: {self.log()}"
            time.sleep(POLL_S)

    def sse(self, path: str, body: dict) -> Iterator[dict | str]:  # type: ignore[type-arg]
        """The events of a streamed response: parsed JSON, or the literal '[DONE]'."""
        with self.client.stream("POST", path, json=body) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line.startswith("data: "):
                    data = line.removeprefix("data: ")
                    yield data if data == "[DONE]" else json.loads(data)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Signal the server and wait for it to exit; its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=timeout_s)

    def leftover_pids(self) -> list[int]:
        return session_pids(self.process.pid)

    def close(self) -> list[int]:
        """Stop the server (SIGTERM, then SIGKILL); the pids of its session that were still
        alive after it exited (killed here as a backstop). Empty when it cleaned up."""
        if self.process.poll() is None:
            try:
                self.stop()
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_S)
        leftover = self.leftover_pids()
        if leftover:
            end_session(self.process.pid, grace_s=5)
        self.client.close()
        self._log.close()
        shutil.rmtree(self.work_dir, ignore_errors=True)
        return leftover
