"""The bench scripts' shared argument types: a bad value is a named usage error."""

import argparse
from pathlib import Path

import pytest

from bench import engine_bench
from bench.arg_types import prompt_file
from bench.workload import load_prompt_texts


def test_prompt_files_of_both_kinds(tmp_path: Path) -> None:
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "def f():"}\n\n{"prompt": "x = 1", "id": 2}\n')
    text = tmp_path / "p.txt"
    text.write_text("first prompt\n\nsecond prompt\n")
    assert load_prompt_texts(prompt_file(str(jsonl))) == ["def f():", "x = 1"]
    assert load_prompt_texts(prompt_file(str(text))) == ["first prompt", "second prompt"]


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"prompt": "a"}\n[1, 2]\n', r"p\.jsonl:2: expected a JSON object with a \"prompt\""),
        ('{"prompt": "a"}\n{"text": "b"}\n', r"p\.jsonl:2: expected a JSON object"),
        ('{"prompt": 3}\n', r"p\.jsonl:1: expected a JSON object"),
        ("{not json\n", r"p\.jsonl:1: expected a JSON object"),
        ("\n\n", r"p\.jsonl: no prompts in it"),
    ],
)
def test_a_bad_prompt_file_names_file_and_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        prompt_file(str(path))


def test_a_missing_prompt_file(tmp_path: Path) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"no such file: .*nope"):
        prompt_file(str(tmp_path / "nope"))


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--prompts", "/nonexistent/prompts.jsonl"], "argument --prompts: no such file"),
        (["--concurrency", "1,x"], "argument --concurrency: not a comma-separated list"),
        (["--k", "0"], "argument --k: must be >= 1, got 0"),
        (["--target", "/nonexistent"], "/nonexistent: not a model directory"),
    ],
)
def test_engine_bench_names_what_is_wrong(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        engine_bench.main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
