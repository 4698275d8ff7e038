"""A real specd daemon in a subprocess on a port of its own (loopback unless told otherwise),
with its own state dir, Ray temp dir and Ray ports, for the tests. `close()` stops its Ray
(through the API, then by session id as a backstop) and the daemon itself, so nothing outlives
a failed test."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from daemon.specd.process_tree import end_session, session_pids
from tests.ports import free_port as free_port  # re-exported for the tests

STARTUP_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 150.0


DEMO_MODELS = Path(__file__).resolve().parents[2] / "packaging" / "demo-models"


def nodes_only_prefix(models_root: Path) -> tuple[str, ...] | None:
    """A command prefix that runs a specd in a mount namespace of its own where the demo
    models are at `models_root`/target and /draft (a tmpfs over the empty `models_root`, so
    nothing is there outside); None where this machine cannot make one (not root)."""
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        return None
    target, draft = DEMO_MODELS / "target", DEMO_MODELS / "draft"
    script = (
        'mount -t tmpfs specd-models "$0" && mkdir "$0/target" "$0/draft" && '
        f'mount --bind "{target}" "$0/target" && mount --bind "{draft}" "$0/draft" '
        '&& exec "$@"'
    )
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(models_root))


def _toml(state_dir: Path, token_file: Path, node_name: str, api_port: int, host: str) -> str:
    return f"""\
host = "{host}"
port = {api_port}
token_file = "{token_file}"
node_name = "{node_name}"
state_dir = "{state_dir}"

[ray]
port = {free_port()}
client_server_port = {free_port()}
dashboard_agent_listen_port = {free_port()}
num_cpus = 1
object_store_memory_bytes = 100000000
"""


class SpecdProcess:
    def __init__(
        self,
        token_file: Path,
        token: str,
        node_name: str,
        host: str = "127.0.0.1",
        prefix: tuple[str, ...] = (),
    ) -> None:
        """host: the address specd binds (and the tests dial); prefix: the command it runs
        under (`ip netns exec NAME`: in another network namespace)."""
        # short path: Ray's unix socket paths under the temp dir must stay below 107 bytes
        self.state_dir = Path(tempfile.mkdtemp(prefix="specd-t-", dir="/tmp"))
        self.port = free_port()
        self.config_file = self.state_dir / "specd.toml"
        self.config_file.write_text(_toml(self.state_dir, token_file, node_name, self.port, host))
        self.url = f"http://{host}:{self.port}"
        self.headers = {"Authorization": f"Bearer {token}"}
        self.log = (self.state_dir / "stdout.log").open("w")
        self.process = subprocess.Popen(
            [
                *prefix,
                *(sys.executable, "-m", "daemon.specd.cli", "run", "--config"),
                str(self.config_file),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.client = httpx.Client(base_url=self.url, timeout=HTTP_TIMEOUT_S)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"specd exited: {self.output()}")
            with contextlib.suppress(httpx.HTTPError):
                if self.client.get("/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"specd not healthy in {STARTUP_TIMEOUT_S} s: {self.output()}")

    def output(self) -> str:
        return (self.state_dir / "stdout.log").read_text(errors="replace")[-3000:]

    def call(
        self, method: str, path: str, headers: dict[str, str] | None = None, **kwargs: Any
    ) -> httpx.Response:
        merged = {**self.headers, **(headers or {})}
        return self.client.request(method, path, headers=merged, **kwargs)

    def ray_pids(self) -> list[int]:
        """Every live process whose command line names this daemon's state dir (its Ray)."""
        marker = str(self.state_dir).encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != self.process.pid:
                with contextlib.suppress(OSError):
                    if marker in (entry / "cmdline").read_bytes() and session_pids(
                        os.getsid(int(entry.name))
                    ):
                        pids.append(int(entry.name))
        return pids

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                self.call("POST", "/v1/ray/stop", timeout=60)
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
        for pid in self.ray_pids():  # backstop: a Ray node the API could not stop
            with contextlib.suppress(ProcessLookupError):
                end_session(os.getsid(pid), grace_s=5)
        self.client.close()
        self.log.close()
        shutil.rmtree(self.state_dir, ignore_errors=True)
