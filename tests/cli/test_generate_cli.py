"""`specctl generate` end to end in a subprocess: JSON output, and clear errors on bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_models import make_tiny_checkpoint


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    return {
        "target": make_tiny_checkpoint(root / "target", seed=0),
        "draft": make_tiny_checkpoint(root / "draft", seed=1, hidden_size=32, num_heads=2),
        "other_vocab": make_tiny_checkpoint(root / "other", seed=2, vocab_size=400),
    }


def specctl(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specctl.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=180,
    )


def assert_clean_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "specctl: error:" in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_json_output(models: dict[str, Path]) -> None:
    proc = specctl(
        "generate",
        "--target",
        models["target"],
        "--draft",
        models["draft"],
        "--prompt",
        "def f(x):",
        "--prompt",
        "hello",
        "--max-tokens",
        "12",
        "--ignore-eos",
        "--json",
        "-k",
        "3",
    )
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(records) == 2
    for rec in records:
        assert len(rec["token_ids"]) == 12
        assert rec["num_draft_tokens"] > 0
        assert 0 <= rec["num_accepted_tokens"] <= rec["num_draft_tokens"]
        assert rec["tokens_per_s"] > 0
        assert isinstance(rec["text"], str)
    assert "acceptance rate" in proc.stderr


def test_target_only_and_prompt_file(models: dict[str, Path], tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a"}\n{"prompt": "bb"}\n')
    proc = specctl(
        "generate",
        "--target",
        models["target"],
        "--prompt-file",
        prompts,
        "--max-tokens",
        "5",
        "--ignore-eos",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["num_draft_tokens"] for r in records] == [0, 0]


def test_missing_directory(tmp_path: Path) -> None:
    assert_clean_error(specctl("generate", "--target", tmp_path / "nope", "--prompt", "x"), "nope")


def test_directory_without_config(tmp_path: Path) -> None:
    assert_clean_error(specctl("generate", "--target", tmp_path, "--prompt", "x"), "config.json")


def test_unsupported_dtype(models: dict[str, Path]) -> None:
    proc = specctl("generate", "--target", models["target"], "--prompt", "x", "--dtype", "int3")
    assert_clean_error(proc, "int3")


def test_different_vocabularies(models: dict[str, Path]) -> None:
    proc = specctl(
        "generate", "--target", models["target"], "--draft", models["other_vocab"], "--prompt", "x"
    )
    assert_clean_error(proc, "vocab")


def test_prompt_longer_than_context(models: dict[str, Path]) -> None:
    proc = specctl("generate", "--target", models["target"], "--prompt", "y" * 600)
    assert_clean_error(proc, "600 tokens", "context")


@pytest.mark.parametrize("k", ["17", "-1"])
def test_k_out_of_range(models: dict[str, Path], k: str) -> None:
    proc = specctl(
        "generate",
        "--target",
        models["target"],
        "--draft",
        models["draft"],
        "--prompt",
        "x",
        "-k",
        k,
    )
    assert_clean_error(proc, "num_speculative_tokens")


def test_prompt_and_prompt_file_together(models: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text("x\n")
    proc = specctl(
        "generate",
        "--target",
        models["target"],
        "--prompt",
        "x",
        "--prompt-file",
        tmp_path / "p.txt",
    )
    assert_clean_error(proc, "exactly one")


def test_bad_jsonl_line(models: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": 3}\n')
    assert_clean_error(
        specctl("generate", "--target", models["target"], "--prompt-file", bad), "p.jsonl:2"
    )


def test_bad_sampling_parameter(models: dict[str, Path]) -> None:
    proc = specctl("generate", "--target", models["target"], "--prompt", "x", "--top-p", "0")
    assert_clean_error(proc, "top_p")


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("bin.txt", b"\xff\xfe\x00\x81 not text", "not UTF-8 text (byte 0)"),
        ("empty.jsonl", b"\n  \n", "no prompts in it"),
        ("surrogate.jsonl", b'{"prompt": "a\\ud800"}\n', "surrogate.jsonl:1: not valid UTF-8 text"),
    ],
)
def test_prompt_files_that_hold_no_usable_prompt(
    models: dict[str, Path], tmp_path: Path, name: str, content: bytes, needle: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    assert_clean_error(
        specctl("generate", "--target", models["target"], "--prompt-file", path), needle
    )


def test_prompt_file_lines_end_at_newlines_only(models: dict[str, Path], tmp_path: Path) -> None:
    """U+2028 inside a JSON string, a form feed inside a text line: one prompt each, as
    written (str.splitlines() split both, and the JSON line failed to parse)."""
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"prompt": "a\u2028b"}, ensure_ascii=False) + "\n")
    text = tmp_path / "p.txt"
    text.write_text("first\x0cstill first\r\nsecond\n")
    for path, count in ((jsonl, 1), (text, 2)):
        proc = specctl(
            "generate", "--target", models["target"], "--prompt-file", path,
            "--max-tokens", "2", "--json",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert len(proc.stdout.strip().splitlines()) == count


def test_seed_outside_what_torch_takes(models: dict[str, Path]) -> None:
    proc = specctl(
        "generate", "--target", models["target"], "--prompt", "x", "--temperature", "1",
        "--seed", str(2**64),
    )  # fmt: skip
    assert_clean_error(proc, "seed must be in [-9223372036854775808, 18446744073709551615]")


def test_a_prompt_argument_that_is_not_utf8(models: dict[str, Path]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "specctl.cli", "generate", "--target", str(models["target"]),
         "--prompt", b"ok \xff\xfe"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert_clean_error(proc, "--prompt #1: not valid UTF-8 text")
