"""The open-loop bench: the same Poisson arrivals through every configuration, each engine on
its own clock (real engines on the demo pair)."""

import json
from pathlib import Path

import pytest

from bench.open_loop import (
    Arrival,
    LoadResult,
    make_arrivals,
    results_table,
    run_open_loop,
    summarize_seeds,
)
from bench.spec_engine import RunSpec, SpecBench
from specctl.demo_pair import require_demo_pair
from tests.bench.bench_module import run_bench_module

SPECS = [RunSpec("target-only"), RunSpec("spec k=2", 2), RunSpec("adaptive", 3, adaptive=True)]


@pytest.fixture(scope="module")
def bench() -> SpecBench:
    target, draft = require_demo_pair()
    return SpecBench(target, draft, "float32", max_batch=2, num_engines=len(SPECS))


def test_arrivals_are_a_seeded_poisson_process() -> None:
    prompts = [[1, 2, 3], [4, 5]]
    first = make_arrivals(prompts, 200, rate=50.0, min_tokens=3, max_tokens=9, seed=7)
    assert first == make_arrivals(prompts, 200, rate=50.0, min_tokens=3, max_tokens=9, seed=7)
    assert first != make_arrivals(prompts, 200, rate=50.0, min_tokens=3, max_tokens=9, seed=8)
    times = [a.at_s for a in first]
    assert times == sorted(times) and times[0] > 0.0
    assert 2.0 < times[-1] < 6.0  # 200 arrivals at 50 a second: ~4 s
    assert {a.max_tokens for a in first} <= set(range(3, 10))
    assert len({a.max_tokens for a in first}) > 3
    assert all(a.prompt in prompts for a in first)


@pytest.mark.parametrize(
    ("rate", "lengths", "message"),
    [(0.0, (1, 2), "rate"), (float("nan"), (1, 2), "rate"), (1.0, (5, 4), "lengths")],
)
def test_arrivals_reject_bad_settings(rate: float, lengths: tuple[int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_arrivals([[1]], 3, rate, lengths[0], lengths[1], seed=0)


def test_every_configuration_serves_the_same_arrivals(bench: SpecBench) -> None:
    prompts = [bench.tokenizer.encode(t) for t in ("def main():", "import os\n", "The sea")]
    # a burst: more requests than the batch holds, so some wait in the queue
    arrivals = make_arrivals(prompts, 6, rate=1000.0, min_tokens=3, max_tokens=8, seed=1)
    results = run_open_loop(bench, SPECS, arrivals, max_batch=2)
    assert [r.mode for r in results] == ["target-only", "spec k=2", "adaptive"]
    for r in results:
        assert r.num_requests == 6
        assert r.num_tokens == sum(a.max_tokens for a in arrivals)
        assert sorted(r.outputs) == [f"r{i}" for i in range(6)]
        assert 0.0 < r.ttft_ms["p50"] <= r.latency_ms["p50"] <= r.latency_ms["p99"]
        assert r.busy_s <= r.span_s + 1e-9
        assert 1.0 <= r.mean_batch <= 2.0
        gap = r.gap_ms  # every request delivered more than once: 3+ tokens, 1 a plain round
        assert 0.0 < gap["p50"] <= gap["p99"] <= gap["max"] <= r.latency_ms["p99"]
    assert results[0].outputs == results[1].outputs == results[2].outputs  # lossless
    assert results[0].mean_k == 0.0 and results[0].acceptance_rate is None
    assert 0.0 < results[1].mean_k <= 2.0 and results[1].acceptance_rate is not None


def test_chunked_prefill_lanes_serve_the_same_tokens(bench: SpecBench) -> None:
    """A lane whose engine prefills 4 prompt tokens a step while others decode gives every
    request the tokens the whole-prompt lane gives it."""
    prompt = bench.tokenizer.encode("def main():\n    import os\n    return os.getcwd()\n")
    assert len(prompt) > 8
    arrivals = [Arrival(0.0, prompt, 12), Arrival(0.001, prompt, 12), Arrival(0.002, prompt, 6)]
    specs = [RunSpec("whole", 2), RunSpec("chunked", 2, prefill_chunk=4)]
    whole, chunked = run_open_loop(bench, specs, arrivals, max_batch=2)
    assert whole.outputs == chunked.outputs and len(whole.outputs) == 3
    assert chunked.num_tokens == 30


def _result(mode: str, mean_ms: float) -> LoadResult:
    return LoadResult(
        mode, 1, 1, 1.0, 1.0, 1.0, {"mean": mean_ms}, {}, {}, 1.0, 0.0, None, outputs={}
    )


def test_the_table_compares_every_chunk_setting_with_the_first_target_only() -> None:
    results = [_result("target-only chunk=none", 100.0), _result("spec k=2 chunk=64", 80.0)]
    table = results_table(results, "t")
    column = next(c for c in table.columns if c.header == "latency speedup")
    assert list(column.cells) == ["1.000", "1.250"]


def test_an_engine_waits_idle_for_the_next_arrival(bench: SpecBench) -> None:
    prompt = bench.tokenizer.encode("def main():")
    arrivals = [Arrival(0.5, prompt, 4), Arrival(3.0, prompt, 4)]
    results = run_open_loop(bench, SPECS[:2], arrivals, max_batch=2)
    for r in results:
        assert r.span_s > 3.0  # the clock jumped over the idle spells
        assert r.busy_share < 0.5
        # each request had the engine to itself: served in far less than the gap between them
        assert r.latency_ms["p99"] < 2500.0


def test_ratios_over_seeds(bench: SpecBench) -> None:
    """Each seed's arrivals through every configuration; per configuration, its ratios to
    target-only in that seed's run, and their medians."""
    prompts = [bench.tokenizer.encode(t) for t in ("def main():", "The sea")]
    per_seed = [
        run_open_loop(bench, SPECS, make_arrivals(prompts, 4, 200.0, 2, 6, seed=seed), max_batch=2)
        for seed in (0, 1)
    ]
    summaries = summarize_seeds(per_seed)
    assert [s.mode for s in summaries] == ["target-only", "spec k=2", "adaptive"]
    assert summaries[0].latency_speedups == summaries[0].throughput_ratios == [1.0, 1.0]
    for summary, index in zip(summaries[1:], (1, 2), strict=True):
        expected = [
            results[0].latency_ms["mean"] / results[index].latency_ms["mean"]
            for results in per_seed
        ]
        assert summary.latency_speedups == expected
        assert summary.median_latency_speedup == (expected[0] + expected[1]) / 2


def test_the_module_runs_and_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "open_loop.json"
    args = ["--requests", "4", "--max-batch", "2", "--min-tokens", "2", "--max-tokens", "6"]
    proc = run_bench_module("open_loop", *args, "--ks", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "greedy outputs identical across modes: True" in proc.stdout
    report = json.loads(out.read_text())
    assert [r["mode"] for r in report["results"]] == [
        "target-only",
        "spec k=2",
        "spec adaptive<=6",
    ]
    assert all(r["num_requests"] == 4 for r in report["results"])
    assert report["rate_per_s"] > 0.0
    assert report["machine"]["torch_threads"] == 1
    assert report["seeds"] == [0] and len(report["per_seed"]) == 1


def test_the_module_runs_each_prefill_chunk_setting(tmp_path: Path) -> None:
    out = tmp_path / "open_loop.json"
    args = ["--requests", "3", "--max-batch", "2", "--min-tokens", "2", "--max-tokens", "4"]
    proc = run_bench_module(
        "open_loop", *args, "--ks", "2", "--prefill-chunks", "none,16", "--prompt-repeat", "2",
        "--json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "greedy outputs identical across modes: True" in proc.stdout
    modes = [r["mode"] for r in json.loads(out.read_text())["results"]]
    assert modes == [
        f"{mode} chunk={chunk}"
        for chunk in ("none", "16")
        for mode in ("target-only", "spec k=2", "spec adaptive<=6")
    ]


def test_the_module_reports_medians_over_seeds(tmp_path: Path) -> None:
    out = tmp_path / "open_loop.json"
    args = ["--requests", "3", "--max-batch", "2", "--min-tokens", "2", "--max-tokens", "4"]
    proc = run_bench_module("open_loop", *args, "--ks", "2", "--seeds", "2", "--seed", "5")
    assert proc.returncode == 0, proc.stderr
    assert "arrival seed 5" in proc.stdout and "arrival seed 6" in proc.stdout
    assert "over arrival seeds 5, 6" in proc.stdout
    proc = run_bench_module("open_loop", *args, "--seeds", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["seeds"] == [0, 1] and len(report["per_seed"]) == 2
    (base, *_) = report["over_seeds"]
    assert base["mode"] == "target-only" and base["median_latency_speedup"] == 1.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--min-tokens", "9", "--max-tokens", "4"], "--min-tokens 9 is above --max-tokens 4"),
        (["--load", "0"], "must be > 0"),
        (["--rate", "-1"], "must be a finite number >= 0"),
        (["--ks", "2,0"], "every k must be >= 1"),
        (["--load", "0.5", "--rate", "2"], "not allowed with argument"),
        (["--prompts", "/nonexistent.jsonl"], "no such file"),
        (["--seeds", "0"], "--seeds"),
        (["--prefill-chunks", "none,0"], "'0' is not a prefill chunk"),
        (["--prefill-chunks", "8,8"], "names a setting twice"),
        (["--prompt-repeat", "0"], "--prompt-repeat"),
    ],
)
def test_bad_arguments_are_named(args: list[str], message: str) -> None:
    proc = run_bench_module("open_loop", *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
