"""Shared by the TUI tests: apps on real files, waiting on the screen, filling a real store."""

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

from textual.app import App
from textual.pilot import Pilot

from daemon.cluster_token import generate_token, write_token
from db import DeploymentRow, GpuSample, MetricSample, RequestRecord, Store, WriteBatch
from specctl.home import SpecctlHome
from tests.tui.terminal import shows
from tui.app import SpecctlApp
from tui.core.settings import TuiSettings

REPO = Path(__file__).resolve().parents[2]
LOCAL_TOML = REPO / "examples" / "local.toml"
EXAMPLE_MODELS = REPO / "examples" / "models"
WAIT_S = 20.0  # a bound on waiting for a worker under load, not a speed claim

# Two specd nodes on closed loopback ports, with hardware declared (as in spark-5090.toml):
# unreachable in the Nodes screen, planned from the declaration in Assign.
REMOTE_PAIR_TOML = """\
# a Spark and a 5090 desktop, both unreachable from here
[[nodes]]
name = "spark"
specd = "127.0.0.1:9"        # nothing listens here
token_file = "cluster.token"
memory_gib = 119
gpus = [{ model = "NVIDIA GB10", memory_gib = 119, unified_memory = true }]

[[nodes]]
name = "rtx5090"
specd = "127.0.0.1:19"
token_file = "cluster.token"
memory_gib = 62
gpus = [{ model = "NVIDIA GeForce RTX 5090", memory_gib = 31.8 }]

[[models]]
name = "llama-70b"
path = "MODELS/llama-3.3-70b-instruct"
dtype = "fp8"
max_model_len = 8192

[[models]]
name = "llama-8b"
path = "MODELS/llama-3.1-8b-instruct"
dtype = "bfloat16"
max_model_len = 8192

[deployment]
name = "spark-5090"

[deployment.verifier]
model = "llama-70b"          # the big one
nodes = ["spark"]

[deployment.drafter]
model = "llama-8b"
node = "rtx5090"

[deployment.speculation]
k = 4

[server]
max_batch_size = 8
"""


def write_remote_pair(directory: Path) -> Path:
    """The remote pair's cluster file (and its token) in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    token_file = directory / "cluster.token"
    if not token_file.exists():
        write_token(token_file, generate_token(), force=False)
    path = directory / "cluster.toml"
    path.write_text(REMOTE_PAIR_TOML.replace("MODELS", str(EXAMPLE_MODELS)))
    return path


def make_app(config: Path, home: Path, **overrides: Any) -> SpecctlApp:
    settings = TuiSettings(
        config_path=config.resolve(),
        save_path=overrides.pop("save_path", config).resolve(),
        home=SpecctlHome(home),
        probe_timeout_s=overrides.pop("probe_timeout_s", 1.0),
    )
    return SpecctlApp(dataclasses.replace(settings, **overrides))


def screen_text(app: App) -> str:
    """What the screen shows, as text lines."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def _fail_if_crashed(app: App, text: str) -> None:
    """An app that exited with an error shows nothing new: fail now rather than at a timeout."""
    if app.return_code not in (None, 0):
        raise AssertionError(f"the app exited with code {app.return_code}\n--- screen ---\n{text}")


async def wait_for_text(pilot: Pilot, *needles: str, timeout_s: float = WAIT_S) -> str:
    """Wait until every needle is on screen; fail showing the screen when one never comes."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = screen_text(pilot.app)
        if all(shows(text, needle) for needle in needles):
            return text
        _fail_if_crashed(pilot.app, text)
        if time.monotonic() > deadline:
            missing = [n for n in needles if not shows(text, n)]
            raise AssertionError(f"never shown: {missing}\n--- screen ---\n{text}")
        await pilot.pause(0.05)


async def wait_until(pilot: Pilot, condition: Any, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        _fail_if_crashed(pilot.app, screen_text(pilot.app))
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not so after {timeout_s} s\n{screen_text(pilot.app)}")
        await pilot.pause(0.05)


async def blocking(function: Any, *args: Any) -> Any:
    """Run a blocking call (a real writer, a subprocess) without stopping the app's loop."""
    return await asyncio.to_thread(function, *args)


def sample(deployment_id: int, at_unix_s: float, **values: Any) -> MetricSample:
    defaults: dict[str, Any] = {
        "acceptance_rate": 0.62,
        "per_position_acceptance": [0.9, 0.7, 0.5, 0.3],
        "mean_acceptance_length": 3.1,
        "tokens_per_s": 120.0,
        "ttft_p50_ms": 35.0,
        "ttft_p99_ms": 80.0,
        "tpot_p50_ms": 8.0,
        "tpot_p99_ms": 12.0,
        "batch_size": 3,
        "k_in_use": 4.0,
        "num_requests_running": 3,
        "num_requests_waiting": 1,
    }
    return MetricSample(deployment_id=deployment_id, time_unix_s=at_unix_s, **(defaults | values))


def _deployment(now: float, num_seconds: int) -> DeploymentRow:
    return DeploymentRow(
        name="local-demo",
        config_path=str(LOCAL_TOML),
        config_text=LOCAL_TOML.read_text(),
        plan_json="{}",
        applied_unix_s=now - num_seconds,
        status="running",
        endpoint="http://127.0.0.1:8000/v1",
    )


def _gpu_readings(now: float) -> list[GpuSample]:
    readings = (("spark", 81, 90 * 2**30, 64), ("rtx5090", 47, 20 * 2**30, 58))
    return [
        GpuSample(
            node_name=name,
            gpu_index=0,
            time_unix_s=now - 1,
            utilization_percent=util,
            memory_used_bytes=used,
            temperature_c=temp,
        )
        for name, util, used, temp in readings
    ]


def _requests(deployment_id: int, now: float) -> list[RequestRecord]:
    return [
        RequestRecord(
            request_id=f"cmpl-{i:04d}",
            deployment_id=deployment_id,
            num_prompt_tokens=12,
            num_output_tokens=64,
            num_draft_tokens=80,
            num_accepted_tokens=50,
            ttft_ms=30.0 + i,
            e2e_latency_ms=900.0 + i,
            finish_reason="length",
            finished_unix_s=now - 5 + i,
        )
        for i in range(3)
    ]


def fill_store(path: Path, num_seconds: int = 30, now_unix_s: float | None = None) -> int:
    """A store as the serving process leaves it: a running deployment, one sample a second
    for the last `num_seconds` (tokens/s rising), GPU readings and a few requests."""
    now = time.time() if now_unix_s is None else now_unix_s
    with Store.open(path, role="writer") as store:
        deployment_id = store.add_deployment(_deployment(now, num_seconds))
        samples = [
            sample(deployment_id, now - num_seconds + i, tokens_per_s=100.0 + i)
            for i in range(1, num_seconds + 1)
        ]
        batch = WriteBatch(
            metric_samples=samples,
            gpu_samples=_gpu_readings(now),
            request_records=_requests(deployment_id, now),
        )
        store.write(batch)
    return deployment_id
