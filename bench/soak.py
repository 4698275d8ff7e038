"""Soak: every parallel shape at once, for minutes, with no hang and no wrong token.

    python -m bench.soak [--minutes 10] [--clients 6] [--seed 0]

Applies a deployment on three local Ray nodes: two replicas (DP = 2) behind the router, each a
verifier split 4:2 over two nodes (PP) with a tensor-parallel drafter (TP = 2) on a third.
Clients send greedy completions with mixed prompt and output lengths (1..160 tokens) and, on a
third of them, a random stop string; a toggler re-applies the file every `--toggle-s` seconds
with k = 0 (rounds in which nobody drafts: the TP drafter's group sits idle), adaptive k, or
fixed k = 4, applied live. Every completed output is checked against target-only `specctl
generate` on the same prompt (a prefix of it: stops cut it short). Prints requests completed,
identical, mismatched, failed cleanly (an OpenAI error), hung (no answer within the client
timeout), latency percentiles and the applies done; exits 1 on any hang or mismatch.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from specctl.demo_pair import DEMO_PROMPTS_CODE, require_demo_pair

MAX_TOKENS = 160
CLIENT_TIMEOUT_S = 120.0
STOPS = ["\n\n", ")", "return", ":"]
SETTINGS = [("k = 0", 0, False), ("adaptive", 6, True), ("k = 4", 4, False)]


def cluster_file(path: Path, port: int, k: int, adaptive: bool) -> Path:
    target, draft = require_demo_pair()
    nodes = "".join(
        f'[[nodes]]\nname = "{n}"\nspecd = "local"\n\n'
        for n in ("verifier-node", "stage-node", "drafter-node")
    )
    path.write_text(
        f"""{nodes}[[models]]
name = "demo-target"
path = "{target}"
dtype = "float32"

[[models]]
name = "demo-draft"
path = "{draft}"
dtype = "float32"

[deployment]
name = "soak"
replicas = 2

[deployment.verifier]
model = "demo-target"
nodes = ["verifier-node", "stage-node"]
pipeline_split = [4, 2]

[deployment.drafter]
model = "demo-draft"
node = "drafter-node"
tensor_parallel_size = 2

[deployment.speculation]
{f"adaptive = true{chr(10)}max_k = {k}" if adaptive else f"k = {k}"}

[server]
host = "127.0.0.1"
port = {port}
max_batch_size = 8
"""
    )
    return path


def specctl(home: Path, *argv: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECCTL_HOME": str(home)}
    cmd = [sys.executable, "-m", "specctl.cli", *argv]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)


def reference(prompts: list[str]) -> list[list[int]]:
    target, _ = require_demo_pair()
    args = ["generate", "--target", str(target), "--max-tokens", str(MAX_TOKENS), "--ignore-eos"]
    args += ["--dtype", "float32", "--json", *[a for p in prompts for a in ("--prompt", p)]]
    done = subprocess.run(
        [sys.executable, "-m", "specctl.cli", *args], capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return [json.loads(line)["token_ids"] for line in done.stdout.splitlines()]


@dataclass
class Tally:
    sent: int = 0
    identical: int = 0
    mismatched: list[str] = field(default_factory=list)
    failed: dict[str, int] = field(default_factory=dict)
    hung: int = 0
    latencies: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def client(url: str, prompts: list[str], refs: list[list[int]], tally: Tally, stop_at: float,
           seed: int) -> None:  # fmt: skip
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_S) as http:
        while time.monotonic() < stop_at:
            i = rng.randrange(len(prompts))
            body = {
                "model": "demo-target",
                "prompt": prompts[i],
                "max_tokens": rng.choice([1, 2, 5, 17, 40, 90, MAX_TOKENS]),
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            }
            if rng.random() < 1 / 3:
                body["stop"] = rng.choice(STOPS)
            start = time.monotonic()
            with tally.lock:
                tally.sent += 1
            try:
                response = http.post("/completions", json=body)
            except httpx.TimeoutException:
                with tally.lock:
                    tally.hung += 1
                continue
            except httpx.HTTPError as exc:
                with tally.lock:
                    tally.failed[type(exc).__name__] = tally.failed.get(type(exc).__name__, 0) + 1
                continue
            took = time.monotonic() - start
            if response.status_code != 200:
                kind = response.json().get("error", {}).get("type", str(response.status_code))
                with tally.lock:
                    tally.failed[kind] = tally.failed.get(kind, 0) + 1
                continue
            choice = response.json()["choices"][0]
            tokens = choice["token_ids"]
            ok = tokens == refs[i][: len(tokens)] and (
                choice["finish_reason"] != "length" or len(tokens) == body["max_tokens"]
            )
            with tally.lock:
                tally.latencies.append(took)
                if ok:
                    tally.identical += 1
                else:
                    tally.mismatched.append(f"prompt {i}: {body} -> {tokens}")


def toggler(home: Path, config: Path, port: int, every_s: float, stop_at: float,
            log: list[str]) -> None:  # fmt: skip
    turn = 0
    while time.monotonic() + every_s < stop_at:
        time.sleep(every_s)
        name, k, adaptive = SETTINGS[turn % len(SETTINGS)]
        turn += 1
        cluster_file(config, port, k, adaptive)
        start = time.monotonic()
        done = specctl(home, "apply", str(config))
        took = time.monotonic() - start
        state = "ok" if done.returncode == 0 else f"FAILED: {done.stderr.strip()[-300:]}"
        log.append(f"{name}: {took:.1f} s {state}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--toggle-s", type=float, default=40.0)
    parser.add_argument("--port", type=int, default=8131)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    lines = [line for line in DEMO_PROMPTS_CODE.read_text().splitlines() if line.strip()]
    code = [json.loads(line)["prompt"] for line in lines[:10]]
    prompts = [*code, "x", "def", "import numpy as np\n\n"]  # mixed prompt lengths
    print(f"reference: target-only greedy for {len(prompts)} prompts ...", flush=True)
    refs = reference(prompts)
    with tempfile.TemporaryDirectory(prefix="soak-", dir="/tmp") as root:
        home, config = Path(root) / "home", Path(root) / "cluster.toml"
        cluster_file(config, args.port, 4, False)
        start = time.monotonic()
        done = specctl(home, "apply", str(config))
        if done.returncode != 0:
            raise SystemExit(f"apply failed:\n{done.stdout}\n{done.stderr}")
        print(f"applied in {time.monotonic() - start:.1f} s; soaking {args.minutes:g} min ...")
        tally, applies = Tally(), []
        stop_at = time.monotonic() + args.minutes * 60
        url = f"http://127.0.0.1:{args.port}/v1"
        threads = [
            threading.Thread(
                target=client, args=(url, prompts, refs, tally, stop_at, args.seed + c)
            )
            for c in range(args.clients)
        ]
        threads.append(
            threading.Thread(
                target=toggler, args=(home, config, args.port, args.toggle_s, stop_at, applies)
            )
        )
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=args.minutes * 60 + CLIENT_TIMEOUT_S + 700)
        stuck = [t.name for t in threads if t.is_alive()]
        status = specctl(home, "status", "--json")
        down = specctl(home, "down")
    lat = sorted(tally.latencies) or [0.0]
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
    completed = tally.identical + len(tally.mismatched)
    print(f"\nrequests sent        {tally.sent}")
    print(f"completed            {completed} (identical to target-only: {tally.identical})")
    print(f"mismatched           {len(tally.mismatched)}")
    print(f"failed cleanly       {sum(tally.failed.values())} {tally.failed or ''}")
    print(f"hung (> {CLIENT_TIMEOUT_S:.0f} s)      {tally.hung}; threads stuck: {stuck or 'none'}")
    print(f"latency p50/p99/max  {p(0.5):.2f} / {p(0.99):.2f} / {lat[-1]:.2f} s")
    print(f"applies (live k)     {len(applies)}: " + "; ".join(applies))
    print(f"status at the end    {_status_said(status)}")
    print(f"down                 {'ok' if down.returncode == 0 else down.stderr[-200:]}")
    for line in tally.mismatched[:5]:
        print("  mismatch:", line[:300])
    if tally.hung or tally.mismatched or stuck:
        raise SystemExit(1)


def _status_said(done: subprocess.CompletedProcess) -> str:
    """ok, or what is not: exit 3 (applied, not all of it ready) says it in its JSON."""
    if done.returncode == 0:
        return "ok"
    try:
        report = json.loads(done.stdout)
    except ValueError:
        return done.stderr[-200:] or f"exit {done.returncode}"
    shards = ", ".join(f"{s['id']} {s['state']}" for s in report.get("shards", []))
    problems = "; ".join(report.get("problems", []))
    return f"exit {done.returncode}: server {report.get('server_status')}, {shards} {problems}"


if __name__ == "__main__":
    main()
