"""Benchmark workloads: prompts (token ids) and how many are in flight at once."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(slots=True)
class Workload:
    name: str  # e.g. "code"
    prompts: list[list[int]]  # token ids
    max_tokens: int


def load_prompt_texts(path: Path) -> list[str]:
    """A .jsonl file with a "prompt" field per line, or a text file with one prompt per line."""
    lines = [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    if path.suffix != ".jsonl":
        return [line for _, line in lines]
    prompts = []
    for n, line in lines:
        try:
            prompt = json.loads(line).get("prompt")
        except (json.JSONDecodeError, AttributeError):
            prompt = None
        if not isinstance(prompt, str):
            raise ValueError(f'{path}:{n}: expected a JSON object with a "prompt" string')
        prompts.append(prompt)
    return prompts


def tokenize(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    return [tokenizer.encode(text) for text in texts]


def repeat_to(prompts: list[list[int]], count: int) -> list[list[int]]:
    """`count` prompts, cycling through the given ones."""
    return [prompts[i % len(prompts)] for i in range(count)]
