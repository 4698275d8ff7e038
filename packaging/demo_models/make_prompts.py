"""Write held-out prompt files (prompts/code.jsonl, prompts/prose.jsonl) for the benchmarks.

Every prompt comes from stdlib files that the split in stdlib_corpus keeps out of training
(plus a few English paragraphs written for this file), so acceptance measured on them is
held-out. Deterministic: sorted files, fixed rules.

    python packaging/demo_models/make_prompts.py
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stdlib_corpus

OUT_DIR = Path(__file__).resolve().parent / "prompts"
PER_FILE = 16
DEF_RE = re.compile(r"^[ \t]*def \w+\(", re.MULTILINE)

ENGLISH = [
    "The library opened at nine in the morning, and by ten the reading room was already full. "
    "Students sat at the long oak tables with their notes spread out in front of them, while "
    "the librarian moved quietly between the shelves, returning books that had been left",
    "Speculative decoding lets a small model guess several tokens ahead while a larger model "
    "checks the guesses in a single pass. When the guesses are right, the large model produces "
    "several tokens for the price of one; when they are wrong, it",
    "To make bread, mix the flour, water, salt and yeast in a large bowl until no dry flour "
    "remains. Cover the bowl and let the dough rest for an hour. Then fold it a few times, "
    "shape it into a round loaf and",
    "The river runs through the middle of the town. On the north bank there is an old market "
    "where farmers sell vegetables, cheese and bread every Saturday. On the south bank, near "
    "the bridge, there is a small park where",
]


def _line_floor(text: str, pos: int) -> int:
    return text.rfind("\n", 0, max(0, pos)) + 1


def code_prompt(text: str, before: int = 200, after: int = 300) -> str | None:
    """Context ending a few lines into the first long function past the file's middle."""
    for m in DEF_RE.finditer(text, len(text) // 2):
        start = m.start()
        end = text.rfind("\n", start, start + after)
        next_def = DEF_RE.search(text, m.end())
        if end <= start or (next_def and next_def.start() < start + after + 200):
            continue
        return text[_line_floor(text, start - before) : end + 1]
    return None


def docstring_prompt(text: str, min_len: int = 240, max_len: int = 320) -> str | None:
    """The first long docstring, cut at a word boundary."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= min_len:
                cut = doc[:max_len]
                return cut[: cut.rfind(" ")]
    return None


def collect() -> tuple[list[dict], list[dict]]:
    code: list[dict] = []
    prose: list[dict] = []
    for rel, path in stdlib_corpus.held_out_paths():
        text = stdlib_corpus.read_text(path) or ""
        if len(code) < PER_FILE and (prompt := code_prompt(text)):
            code.append({"id": f"code-{len(code):02d}", "source": rel, "prompt": prompt})
        limit = PER_FILE - len(ENGLISH)
        if len(prose) < limit and (prompt := docstring_prompt(text)):
            prose.append({"id": f"prose-{len(prose):02d}", "source": rel, "prompt": prompt})
    for text in ENGLISH:
        prose.append({"id": f"prose-{len(prose):02d}", "source": "handwritten", "prompt": text})
    return code, prose


def main() -> None:
    code, prose = collect()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name, rows in (("code", code), ("prose", prose)):
        lines = [json.dumps(r, ensure_ascii=False) for r in rows]
        (OUT_DIR / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        print(f"{name}: {len(rows)} prompts")


if __name__ == "__main__":
    main()
