"""argparse types shared by the bench scripts: a bad value is a named usage error, not a
traceback."""

import argparse
from pathlib import Path

import torch

from bench.workload import load_prompt_texts
from specctl.demo_pair import DEMO_PROMPTS_CODE, demo_pair_dirs

DEVICES = ("cpu", "cuda")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_int_list(text: str) -> list[int]:
    """A comma-separated list of integers >= 1."""
    try:
        values = [int(n) for n in text.split(",")]
    except ValueError:
        message = f"not a comma-separated list of integers: {text!r}"
        raise argparse.ArgumentTypeError(message) from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return values


def prompt_file(text: str) -> Path:
    """A prompts file that exists and reads as one (workload.load_prompt_texts), with at least
    one prompt."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    try:
        texts = load_prompt_texts(path)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not texts:
        raise argparse.ArgumentTypeError(f"{text}: no prompts in it")
    return path


def device_problem(device: str) -> str | None:
    """What is wrong with a `--device` value, or None."""
    if device not in DEVICES:
        return f"--device must be one of {', '.join(DEVICES)}, got {device!r}"
    if device == "cuda" and not torch.cuda.is_available():
        return "--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)"
    return None


def add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    """--target, --draft (default: the demo pair) and --prompts (default: the code prompts)."""
    default_target, default_draft = demo_pair_dirs()
    parser.add_argument("--target", type=Path, default=default_target)
    parser.add_argument("--draft", type=Path, default=default_draft)
    parser.add_argument("--prompts", type=prompt_file, default=DEMO_PROMPTS_CODE)
