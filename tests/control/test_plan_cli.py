"""`specctl plan` as a user runs it: a real subprocess, its output and its exit status."""

import json
import subprocess
import sys
from pathlib import Path

from daemon.cluster_token import generate_token, write_token

from .cluster_files import REPO_ROOT, SPARK_5090, replace_line, write_cluster


def _specctl(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specctl.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_plan_explains_the_seed_setup_in_words() -> None:
    result = _specctl("plan", "examples/spark-5090.toml")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("Plan for examples/spark-5090.toml (deployment spark-5090): fits\n")
    for phrase in (
        "verifier llama-70b: 70.6B parameters (LlamaForCausalLM, 80 layers, 64 heads, 8 KV "
        "heads) in fp8; context 8192 tokens",
        "drafter llama-8b: 8.0B parameters",
        "verifier llama-70b: all 80 layers on spark (one pipeline stage, tensor parallel 1)",
        "verifier llama-70b on spark GPU 0: 65.7 GiB weights + 20.0 GiB KV cache for 8 x 8192",
        "drafter llama-8b on rtx5090 GPU 0: 15.0 GiB weights + 8.0 GiB KV cache for 8 x 8192",
        "drafter on rtx5090, verifier on spark: different machines",
        "Dry run: nothing was started or changed.",
    ):
        assert phrase in " ".join(out.split()), phrase
    assert result.stderr == ""


def test_plan_json_is_the_plan_object() -> None:
    result = _specctl("plan", "examples/spark-5090.toml", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["verdict"] == "fits" and plan["endpoint"] == "http://127.0.0.1:8000/v1"
    assert [(s["role"], s["node"], s["layer_start"], s["layer_end"]) for s in plan["shards"]] == [
        ("drafter", "rtx5090", 0, 32),
        ("verifier", "spark", 0, 80),
    ]
    assert plan["speculation"] == {
        "drafter": "model",
        "k": 4,
        "adaptive": False,
        "max_k": 4,
        "mode": "overlapped",
    }


def test_plan_of_the_local_example_fits_here() -> None:
    result = _specctl("plan", "examples/local.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(deployment local-demo): fits" in result.stdout
    assert "verifier demo-target on verifier-node CPU" in result.stdout
    assert "drafter demo-draft on drafter-node CPU" in result.stdout


def test_invalid_file_exits_2_with_one_line(tmp_path: Path) -> None:
    text = replace_line(SPARK_5090, 'node = "rtx5090"', 'node = "gpu-b"  # <-- here')
    _, line = write_cluster(tmp_path, text)
    result = _specctl("plan", "cluster.toml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        f'specctl: error: cluster.toml:{line}: deployment.drafter.node: unknown node "gpu-b"; '
        "nodes are: spark, rtx5090\n"
    )


def test_a_plan_that_does_not_fit_exits_1_and_says_why(tmp_path: Path) -> None:
    text = replace_line(SPARK_5090, 'dtype = "fp8"', 'dtype = "bfloat16"')
    path, _ = write_cluster(tmp_path, text)
    result = _specctl("plan", str(path))
    assert result.returncode == 1
    out = " ".join(result.stdout.split())
    assert "(deployment test): does not fit" in out
    assert "Problems - verifier llama-70b does not fit on spark GPU 0: needs 153.6 GiB" in out
    assert 'dtype = "fp8" for llama-70b' in out


def test_contradictory_flags_and_missing_file() -> None:
    result = _specctl("plan", "examples/local.toml", "--probe", "--offline")
    assert result.returncode == 2 and "contradict" in result.stderr
    result = _specctl("plan", "nowhere.toml")
    assert result.returncode == 2
    assert result.stderr == "specctl: error: nowhere.toml: file not found\n"


def test_plan_warns_of_the_token_files_apply_would_refuse(tmp_path: Path) -> None:
    """The specd nodes' token files are read by `plan` too (hardware declared: no node is
    asked, so nothing else would read them): a missing file, or files holding different
    tokens, is a warning naming the nodes and files; the plan itself still fits."""
    text = replace_line(
        SPARK_5090,
        'specd = "spark.local:7601"',
        'specd = "spark.local:7601"\ntoken_file = "a.token"',
    )
    text = replace_line(
        text, 'specd = "desktop.local:7601"', 'specd = "desktop.local:7601"\ntoken_file = "b.token"'
    )
    path, _ = write_cluster(tmp_path, text)
    write_token(tmp_path / "a.token", generate_token(), force=False)

    missing = _specctl("plan", str(path), "--json")
    assert missing.returncode == 0, missing.stderr
    warnings = json.loads(missing.stdout)["warnings"]
    assert f"node rtx5090: {tmp_path}/b.token: token file not found" in " ".join(warnings)
    assert "apply would refuse it: node rtx5090" in " ".join(warnings)

    write_token(tmp_path / "b.token", generate_token(), force=False)
    mixed = _specctl("plan", str(path))
    assert mixed.returncode == 0, mixed.stderr
    out = " ".join(mixed.stdout.split())
    assert "Warnings" in out and "hold different tokens" in out and "b.token" in out

    (tmp_path / "b.token").unlink()
    write_token(tmp_path / "b.token", (tmp_path / "a.token").read_text().strip(), force=False)
    same = _specctl("plan", str(path), "--json")
    assert not [w for w in json.loads(same.stdout)["warnings"] if "token" in w]
