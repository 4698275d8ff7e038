"""Acceptance proxies for the demo pair (greedy, teacher-forced, held-out).

* text agreement: over the held-out prompt texts themselves, fraction of positions where the
  draft's argmax equals the target's argmax;
* continuation agreement: the target greedily continues each prompt; the draft is
  teacher-forced on prompt + continuation and scored on the continuation positions. This is
  the per-token acceptance probability of greedy speculative decoding.

    python packaging/demo_models/evaluate_pair.py [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

HERE = Path(__file__).resolve().parent
DEMO = HERE.parent / "demo-models"


def load_prompts(kind: str) -> list[str]:
    lines = (HERE / "prompts" / f"{kind}.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt"] for line in lines if line.strip()]


@torch.no_grad()
def agreement(
    draft: torch.nn.Module, target: torch.nn.Module, ids: torch.Tensor, start: int
) -> tuple[int, int]:
    """(agreeing positions, positions) over next-token predictions from `start` on."""
    a = draft(input_ids=ids).logits[0, start:-1].argmax(-1)
    b = target(input_ids=ids).logits[0, start:-1].argmax(-1)
    return int((a == b).sum()), b.numel()


@torch.no_grad()
def evaluate(
    kind: str,
    draft: torch.nn.Module,
    target: torch.nn.Module,
    tok: PreTrainedTokenizerBase,
    max_new_tokens: int,
) -> dict[str, float]:
    text_n = text_d = cont_n = cont_d = 0
    for prompt in load_prompts(kind):
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        n, d = agreement(draft, target, ids, 0)
        text_n, text_d = text_n + n, text_d + d
        full = target.generate(input_ids=ids, max_new_tokens=max_new_tokens, do_sample=False)
        n, d = agreement(draft, target, full, ids.shape[1] - 1)
        cont_n, cont_d = cont_n + n, cont_d + d
    return {
        "text_agreement": text_n / text_d,
        "continuation_agreement": cont_n / cont_d,
        "continuation_tokens": cont_d,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--demo", type=Path, default=DEMO)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    tok = AutoTokenizer.from_pretrained(args.demo / "target")
    target = AutoModelForCausalLM.from_pretrained(args.demo / "target", dtype=dtype).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.demo / "draft", dtype=dtype).eval()
    for kind in ("code", "prose"):
        res = evaluate(kind, draft, target, tok, args.max_new_tokens)
        print(kind, json.dumps({k: round(v, 4) for k, v in res.items()}))


if __name__ == "__main__":
    main()
