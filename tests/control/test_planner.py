"""Placement and memory fit on declared hardware (no network), explained in words."""

from pathlib import Path

import pytest

from daemon.specd.inventory import GpuInfo, HostInfo, Inventory
from specctl.config import ClusterConfig, load_config
from specctl.planner import Plan, gather_node_facts, make_plan
from specctl.planner.deployable import not_deployable
from specctl.planner.facts import facts_from_inventory

from .cluster_files import REPO_ROOT, SPARK_5090, replace_line, write_cluster, write_model

GIB = 2**30
FP8_REFUSED = (
    "apply would refuse it: r0/verifier/stage0: dtype fp8 is for planning only; the runtime "
    "loads float32, bfloat16, float16"
)


def _plan(tmp_path: Path, text: str = SPARK_5090) -> tuple[ClusterConfig, Plan]:
    path, _ = write_cluster(tmp_path, text)
    config = load_config(path)
    return config, make_plan(config, gather_node_facts(config, mode="offline"))


def test_seed_setup_verifier_on_the_spark_drafter_on_the_5090(tmp_path: Path) -> None:
    _, plan = _plan(tmp_path)
    assert plan.verdict == "fits" and plan.problems == []
    drafter, verifier = plan.shards
    assert (drafter.role, drafter.node, drafter.device, drafter.gpu_indices) == (
        "drafter",
        "rtx5090",
        "cuda",
        [0],
    )
    assert (verifier.role, verifier.node, verifier.layer_start, verifier.layer_end) == (
        "verifier",
        "spark",
        0,
        80,
    )
    assert verifier.has_embedding and verifier.has_lm_head
    # 70.55B parameters at one byte; 20 GiB of bfloat16 KV cache for 8 x 8192 tokens
    assert verifier.memory_per_rank.weights_bytes == 70_553_706_496
    assert verifier.memory_per_rank.kv_cache_bytes == 20 * GIB
    text = "\n".join(plan.explanation)
    assert "verifier llama-70b: all 80 layers on spark (one pipeline stage" in text
    assert (
        "drafter llama-8b on rtx5090 GPU 0: 15.0 GiB weights + 8.0 GiB KV cache for 8 x 8192 "
        "tokens + 1.6 GiB activations and runtime = 24.6 GiB of 28.6 GiB free — fits" in text
    )
    assert "drafter on rtx5090, verifier on spark: different machines" in text
    assert "spark: as declared in the cluster file" in text and "unified memory" in text
    # the 70B checkpoint is planned in fp8, which the runtime does not load (yet)
    assert plan.warnings == [FP8_REFUSED]


def test_a_verifier_split_both_ways_is_planned_but_not_deployable(tmp_path: Path) -> None:
    """Pipeline stages with tensor parallelism in each: planned (for sizing machines), and
    warned of, as `apply` refuses it before it starts anything."""
    text = (REPO_ROOT / "examples" / "local.toml").read_text()
    text = text.replace("../packaging", str(REPO_ROOT / "packaging"))
    text = replace_line(
        text, 'nodes = ["verifier-node"]', 'nodes = ["verifier-node", "drafter-node"]'
    )
    text = replace_line(text, 'model = "demo-draft"', 'model = "ngram"')
    text = replace_line(text, 'node = "drafter-node"', "")
    text = text.replace("[deployment.drafter]", "tensor_parallel_size = 2\n\n[deployment.drafter]")
    _, plan = _plan(tmp_path, text)
    assert plan.verdict == "fits", plan.problems
    assert not_deployable(plan.shards) == [
        "r0: the verifier is split into 2 pipeline stages with tensor parallelism in each; that "
        "combination is not deployable yet: use tensor_parallel_size = 1 with several nodes, or "
        "one node"
    ]
    assert f"apply would refuse it: {not_deployable(plan.shards)[0]}" in plan.warnings


def test_plan_round_trips_through_json(tmp_path: Path) -> None:
    _, plan = _plan(tmp_path)
    again = Plan.model_validate_json(plan.model_dump_json())
    assert again == plan
    assert {(s["role"], s["node"]) for s in plan.model_dump()["shards"]} == {
        ("drafter", "rtx5090"),
        ("verifier", "spark"),
    }


def test_auto_split_across_both_machines_follows_free_memory(tmp_path: Path) -> None:
    text = replace_line(SPARK_5090, 'nodes = ["spark"]', 'nodes = ["spark", "rtx5090"]')
    text = replace_line(text, 'model = "llama-8b"', 'model = "ngram"')
    text = replace_line(text, 'node = "rtx5090"', "")
    _, plan = _plan(tmp_path, text)
    assert plan.verdict == "fits", plan.problems
    first, last = plan.shards
    assert (first.node, last.node) == ("spark", "rtx5090")
    assert first.layer_end == last.layer_start and last.layer_end == 80
    assert first.has_embedding and not first.has_lm_head
    assert last.has_lm_head and not last.has_embedding
    split_line = next(line for line in plan.explanation if "layers split" in line)
    assert split_line.startswith(
        f"verifier llama-70b: 80 layers split {first.num_layers}:{last.num_layers} across "
        "spark:rtx5090 in proportion to free memory after fixed costs ("
    )
    # the split tracks the rooms: the Spark has about four times the 5090's room for layers
    assert 60 <= first.num_layers <= 70
    assert "n-gram prompt lookup inside the verifier's last stage on rtx5090" in "\n".join(
        plan.explanation
    )


def test_explicit_split_is_used_as_given(tmp_path: Path) -> None:
    text = replace_line(SPARK_5090, 'nodes = ["spark"]', 'nodes = ["spark", "rtx5090"]')
    text = replace_line(text, 'pipeline_split = "auto"', "pipeline_split = [78, 2]")
    text = replace_line(text, 'model = "llama-8b"', 'model = "ngram"')
    text = replace_line(text, 'node = "rtx5090"', "")
    _, plan = _plan(tmp_path, text)
    assert [(s.layer_start, s.layer_end) for s in plan.shards] == [(0, 78), (78, 80)]
    assert any("split 78:2 across spark:rtx5090 as given" in line for line in plan.explanation)


def test_a_verifier_that_does_not_fit_says_where_by_how_much_and_what_helps(
    tmp_path: Path,
) -> None:
    text = replace_line(SPARK_5090, 'dtype = "fp8"', 'dtype = "bfloat16"')
    _, plan = _plan(tmp_path, text)
    assert plan.verdict == "does_not_fit"
    (problem,) = plan.problems
    assert problem.startswith(
        "verifier llama-70b does not fit on spark GPU 0: needs 153.6 GiB, 107.1 GiB free — "
        "short by 46.5 GiB. Would help: "
    )
    assert 'dtype = "fp8" for llama-70b (saves 65.7 GiB per rank)' in problem
    assert "another node in deployment.verifier.nodes" in problem
    assert [s.verdict for s in plan.shards] == ["fits", "does_not_fit"]


def test_a_drafter_that_does_not_fit_is_told_where_it_would(tmp_path: Path) -> None:
    text = replace_line(SPARK_5090, "max_batch_size = 8", "max_batch_size = 24")
    _, plan = _plan(tmp_path, text)
    assert plan.verdict == "does_not_fit"
    drafter_problem = next(p for p in plan.problems if p.startswith("drafter llama-8b"))
    assert "does not fit on rtx5090 GPU 0" in drafter_problem
    assert "max_batch_size = " in drafter_problem and "(now 24)" in drafter_problem
    assert "the drafter on spark (107.1 GiB free)" in drafter_problem
    assert 'drafter model = "ngram"' in drafter_problem


def test_drafter_beside_the_verifier_is_allowed_and_said(tmp_path: Path) -> None:
    text = replace_line(SPARK_5090, 'node = "rtx5090"', 'node = "spark"')
    _, crowded = _plan(tmp_path, text)  # 24.6 GiB of drafter and 87.9 GiB of verifier
    assert crowded.verdict == "does_not_fit"
    assert "moving the drafter llama-8b off this GPU" in crowded.problems[0]
    text = replace_line(text, "max_batch_size = 8", "max_batch_size = 4")
    _, plan = _plan(tmp_path, text)
    assert plan.verdict == "fits"
    assert any(
        line.startswith("drafter and verifier share spark: allowed") for line in plan.explanation
    )
    (spark,) = [d for d in plan.devices if d.nodes == ["spark"]]
    assert spark.shards == ["r0/drafter", "r0/verifier/stage0"]
    assert spark.planned_bytes == sum(s.memory_per_rank.total_bytes for s in plan.shards)


def test_tensor_parallel_needs_as_many_gpus(tmp_path: Path) -> None:
    text = replace_line(
        SPARK_5090, 'node = "rtx5090"', 'node = "rtx5090"\ntensor_parallel_size = 2'
    )
    _, plan = _plan(tmp_path, text)
    assert plan.verdict == "does_not_fit"
    assert plan.problems == [
        "drafter llama-8b: tensor_parallel_size 2 needs 2 GPUs on rtx5090, which has 1; use "
        "tensor_parallel_size 1 or a node with more GPUs"
    ]


def test_replicas_take_the_gpus_with_the_most_memory_left(tmp_path: Path) -> None:
    write_model(tmp_path / "target", num_hidden_layers=8)
    write_model(tmp_path / "draft", num_hidden_layers=2)
    text = """
[[nodes]]
name = "big"
specd = "big.local:7601"
gpus = [{ model = "A", memory_gib = 8, count = 2 }]

[[nodes]]
name = "small"
specd = "small.local:7601"
gpus = [{ model = "B", memory_gib = 4, count = 2 }]

[[models]]
name = "target"
path = "target"

[[models]]
name = "draft"
path = "draft"

[deployment]
replicas = 2
verifier = { model = "target", nodes = ["big"] }
drafter = { model = "draft", node = "small" }
"""
    _, plan = _plan(tmp_path, text)
    assert plan.verdict == "fits", plan.problems
    assert [(s.replica, s.role, s.node, s.gpu_indices) for s in plan.shards] == [
        (0, "drafter", "small", [0]),
        (0, "verifier", "big", [0]),
        (1, "drafter", "small", [1]),
        (1, "verifier", "big", [1]),
    ]
    assert any(
        line.startswith("replica 1: verifier target on big GPU 1") for line in plan.explanation
    )


def test_unknown_hardware_is_said_and_the_verdict_is_unknown(tmp_path: Path) -> None:
    text = replace_line(SPARK_5090, "memory_gib = 62", "")
    text = replace_line(
        text, 'gpus = [{ model = "NVIDIA GeForce RTX 5090", memory_gib = 31.8 }]', ""
    )
    _, plan = _plan(tmp_path, text)
    assert plan.verdict == "unknown"
    (problem,) = plan.problems
    assert problem.startswith(
        "drafter llama-8b: cannot check the fit on rtx5090: its memory is unknown"
    )
    assert any(
        line.startswith("rtx5090: ") and "memory unknown" in line for line in plan.explanation
    )


def test_make_plan_needs_facts_for_every_node(tmp_path: Path) -> None:
    path, _ = write_cluster(tmp_path, SPARK_5090)
    config = load_config(path)
    facts = gather_node_facts(config, mode="offline")
    del facts["spark"]
    with pytest.raises(ValueError, match="no facts for node"):
        make_plan(config, facts)


def test_the_local_example_fits_on_this_machine() -> None:
    from specctl.config import default_config_path

    config = load_config(default_config_path())
    facts = gather_node_facts(config)
    assert {f.source for f in facts.values()} == {"local"}
    assert facts["verifier-node"].machine == facts["drafter-node"].machine
    plan = make_plan(config, facts)
    assert plan.verdict == "fits", plan.problems
    assert {(s.role, s.node, s.device) for s in plan.shards} == {
        ("verifier", "verifier-node", "cpu"),
        ("drafter", "drafter-node", "cpu"),
    }
    (cpu,) = plan.devices  # two local nodes share one machine's memory
    assert cpu.nodes == ["verifier-node", "drafter-node"] and cpu.device == "cpu"
    assert Path(plan.shards[0].model_path).name == "draft"
    assert any("one machine, so they share its memory" in line for line in plan.explanation)


def _inventory(hostname: str, gpus: list[GpuInfo], memory_total_bytes: int) -> dict:
    host = HostInfo(hostname, 8, memory_total_bytes, memory_total_bytes // 2)
    return Inventory(node_name="x", host=host, gpus=gpus).to_json()


def test_facts_from_specd_inventories_unified_and_unknown_memory(tmp_path: Path) -> None:
    path, _ = write_cluster(tmp_path, SPARK_5090)
    config = load_config(path)
    facts = gather_node_facts(config, mode="offline")
    # GB10 as specd reports it: memory queries unsupported, so system memory, marked unified
    gb10 = GpuInfo(
        index=0,
        name="NVIDIA GB10",
        memory_total_bytes=128 * GIB,
        memory_free_bytes=100 * GIB,
        unified_memory=True,
    )
    facts["spark"] = facts_from_inventory(
        config.node("spark"), _inventory("spark", [gb10], 128 * GIB), "specd"
    )
    # a GPU whose memory NVML could not read at all
    facts["rtx5090"] = facts_from_inventory(
        config.node("rtx5090"),
        _inventory("desk", [GpuInfo(index=0, name="RTX 5090")], 64 * GIB),
        "specd",
    )
    plan = make_plan(config, facts)
    assert plan.verdict == "unknown"
    assert plan.problems == [
        "drafter llama-8b: cannot check the fit on rtx5090 GPU 0: the GPU does not report its "
        "memory; declare gpus = [{ memory_gib = ... }] for the node in the cluster file"
    ]
    verifier = plan.shards[1]
    assert verifier.verdict == "fits" and verifier.free_bytes == int(128 * GIB * 0.9)
    assert any(
        "1 x NVIDIA GB10 with 128.0 GiB unified memory, 100.0 GiB free now" in line
        for line in plan.explanation
    )


def test_less_free_now_than_planned_is_a_warning(tmp_path: Path) -> None:
    path, _ = write_cluster(tmp_path, SPARK_5090)
    config = load_config(path)
    facts = gather_node_facts(config, mode="offline")
    busy = GpuInfo(
        index=0, name="RTX 5090", memory_total_bytes=32 * GIB, memory_free_bytes=10 * GIB
    )
    facts["rtx5090"] = facts_from_inventory(
        config.node("rtx5090"), _inventory("desk", [busy], 64 * GIB), "specd"
    )
    plan = make_plan(config, facts)
    assert plan.verdict == "fits"
    assert plan.warnings[0] == (
        "rtx5090 GPU 0: the plan needs 24.6 GiB there, 10.0 GiB is free now (other processes "
        "hold the rest); loading may fail until they exit"
    )
    assert plan.warnings[1:] == [FP8_REFUSED]
