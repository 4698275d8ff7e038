"""What the TUI's background refreshes cost, figures side by side in one run:

- the Dashboard's store read (a worker's work, once a second) on a store holding the last
  `--minutes` of one-second samples, GPU readings of two nodes and `--requests` requests;
- the same read while another process holds the store in an EXCLUSIVE lock (how long the
  worker waits before it says "busy"; the screen keeps its last figures meanwhile);
- the UI thread's share of a Dashboard refresh: filling the sparklines, figures and request
  table from a reading (headless app, 160x48);
- how late a 10 ms tick on the app's event loop runs (the screen's stalls) with the Dashboard
  idle and refreshing four times a second;
- the Nodes screen's read of this machine's inventory (the local nodes of examples/local.toml).

    .venv/bin/python bench/tui_refresh.py [--runs 20] [--minutes 5] [--requests 500] [--seconds 10]
"""

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from db import DeploymentRow, GpuSample, MetricSample, RequestRecord, Store
from db.writes import WriteBatch
from specctl.config.loader import load_config
from specctl.home import SpecctlHome
from tui.app import SpecctlApp
from tui.core.dashboard import DashboardReader
from tui.core.nodes import read_cluster_nodes
from tui.core.settings import TuiSettings
from tui.messages import DashboardRead

REPO = Path(__file__).resolve().parents[1]

LOCAL_TOML = REPO / "examples" / "local.toml"
STORE_HOLDER = REPO / "tests" / "tui" / "store_holder.py"
NODES = ("spark", "rtx5090")
TICK_S = 0.010
LIVE_REFRESH_S = 0.25  # four times the default rate
IDLE_REFRESH_S = 3600.0  # the baseline: one read at mount, then none


def fill_store(path: Path, num_seconds: int, num_requests: int, now: float) -> None:
    """A store as a serving process leaves it after `num_seconds` of serving."""
    with Store.open(path, role="writer") as store:
        deployment_id = store.add_deployment(
            DeploymentRow(
                name="bench",
                config_path=str(LOCAL_TOML),
                config_text=LOCAL_TOML.read_text(),
                plan_json="{}",
                applied_unix_s=now - num_seconds,
                status="running",
                endpoint="http://127.0.0.1:8000/v1",
            )
        )
        at = [now - num_seconds + i for i in range(1, num_seconds + 1)]
        samples = [
            MetricSample(
                deployment_id=deployment_id,
                time_unix_s=t,
                acceptance_rate=0.6 + 0.1 * (i % 3),
                per_position_acceptance=[0.9, 0.75, 0.6, 0.45, 0.3],
                mean_acceptance_length=3.0,
                tokens_per_s=100.0 + i % 50,
                ttft_p50_ms=40.0,
                ttft_p99_ms=90.0,
                tpot_p50_ms=9.0,
                tpot_p99_ms=14.0,
                batch_size=4,
                k_in_use=4.0,
                num_requests_running=4,
            )
            for i, t in enumerate(at)
        ]
        gpus = [
            GpuSample(node_name=node, gpu_index=0, time_unix_s=t, utilization_percent=70)
            for t in at
            for node in NODES
        ]
        requests = [
            RequestRecord(
                request_id=f"cmpl-{i:06d}",
                deployment_id=deployment_id,
                num_prompt_tokens=20,
                num_output_tokens=64,
                num_draft_tokens=80,
                num_accepted_tokens=50,
                ttft_ms=40.0,
                e2e_latency_ms=800.0,
                finish_reason="length",
                finished_unix_s=now - num_requests + i,
            )
            for i in range(num_requests)
        ]
        store.write(WriteBatch(samples, gpus, requests), now_unix_s=now)


def timed(function: Callable[[], object], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return times


def time_locked_reads(path: Path, window_minutes: float, runs: int) -> tuple[list[float], str]:
    holder = subprocess.Popen(
        [sys.executable, str(STORE_HOLDER), str(path), "exclusive"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        if holder.stdout.readline().strip() != "locked":
            raise RuntimeError("the lock holder did not take the lock")
        reader = DashboardReader(path, window_minutes)
        states: list[str] = []
        times = timed(lambda: states.append(reader.read().state), runs)
        reader.close()
        return times, ", ".join(sorted(set(states)))
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)


async def time_ui_share(home: Path, runs: int) -> list[float]:
    """The Dashboard's handler of one reading: the UI thread's work per refresh."""
    settings = TuiSettings(config_path=LOCAL_TOML, save_path=LOCAL_TOML, home=SpecctlHome(home))
    app = SpecctlApp(settings)
    reading = DashboardReader(settings.home.db_file, settings.dashboard_window_minutes).read()
    handler_s = []
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("5")
        await pilot.pause(0.5)
        screen = app.screen
        for _ in range(runs):
            started = time.perf_counter()
            screen._show_reading(DashboardRead(reading))  # type: ignore[attr-defined]
            handler_s.append(time.perf_counter() - started)
            await pilot.pause()  # let the refresh it asked for be drawn
    return handler_s


async def loop_lateness(home: Path, refresh_s: float, duration_s: float) -> list[float]:
    """How late a 10 ms tick on the app's event loop runs while the Dashboard refreshes every
    `refresh_s` (store read in a worker, widgets filled and drawn on the loop): the screen's
    stalls. Headless app at 160x48."""
    settings = TuiSettings(
        config_path=LOCAL_TOML,
        save_path=LOCAL_TOML,
        home=SpecctlHome(home),
        dashboard_refresh_s=refresh_s,
    )
    app = SpecctlApp(settings)
    late_s: list[float] = []
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("5")
        await pilot.pause(1.0)
        deadline = time.perf_counter() + duration_s
        while time.perf_counter() < deadline:
            asked = time.perf_counter()
            await asyncio.sleep(TICK_S)
            late_s.append(time.perf_counter() - asked - TICK_S)
    return late_s


def lateness(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (
        f"p50 {statistics.median(values) * 1000:6.1f} ms   "
        f"p99 {p99 * 1000:6.1f}   max {max(values) * 1000:6.1f}"
    )


def summary(values: list[float]) -> str:
    return (
        f"median {statistics.median(values) * 1000:7.1f} ms   "
        f"min {min(values) * 1000:7.1f}   max {max(values) * 1000:7.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=10.0, help="per lateness run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="specctl-bench-") as directory:
        home = Path(directory)
        db_file = SpecctlHome(home).db_file
        fill_store(db_file, int(args.minutes * 60), args.requests, time.time())
        reader = DashboardReader(db_file, args.minutes)
        reader.read()  # open the store once, as the screen's worker keeps it open
        reads = timed(reader.read, args.runs)
        num_samples = len(reader.read().data.samples)
        reader.close()
        locked, locked_states = time_locked_reads(db_file, args.minutes, max(3, args.runs // 4))
        handler = asyncio.run(time_ui_share(home, args.runs))
        idle = asyncio.run(loop_lateness(home, IDLE_REFRESH_S, args.seconds))
        live = asyncio.run(loop_lateness(home, LIVE_REFRESH_S, args.seconds))
    config = load_config(LOCAL_TOML)
    nodes = timed(lambda: read_cluster_nodes(config, 2.0, {}), max(3, args.runs // 4))
    print(f"specctl TUI refresh costs, {args.runs} runs ({args.minutes:g} min window)")
    rows = [
        (f"dashboard store read ({num_samples} samples)", summary(reads), "worker"),
        (f"same, store EXCLUSIVE-locked ({locked_states})", summary(locked), "worker"),
        ("dashboard fill from a reading", summary(handler), "UI thread"),
        ("nodes read (local inventory)", summary(nodes), "worker"),
        ("UI loop lateness, dashboard idle", lateness(idle), f"{args.seconds:g} s"),
        (f"UI loop lateness, refresh every {LIVE_REFRESH_S:g} s", lateness(live), "same"),
    ]
    for name, figures, where in rows:
        print(f"  {name:<42} {figures}   [{where}]")


if __name__ == "__main__":
    main()
