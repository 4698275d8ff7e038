"""vLLM as a peer engine: run with bench/.venv-vllm/bin/python, not the project's interpreter.

    python bench/peers/vllm_peer.py JOB.json OUT.json

JOB.json: {"target": dir, "draft": dir | null, "num_speculative_tokens": K,
"prompts_token_ids": [[ids]] (optional), "prompts_text": [str] (optional), "max_tokens": N,
"concurrency": C (1: one request at a time; C > 1: all prompts submitted at once, at most C
running), "dtype": "float32", "gpu_memory_utilization": 0.3, "kv_cache_gib": 1,
"max_model_len": L | null, "enforce_eager": true, "warmup_tokens": W,
"enable_prefix_caching": false, "temperature": 0.0}.
Generation ignores EOS, so every request makes exactly N tokens; greedy at temperature 0 (the
default), else sampled at it (the LLM's seed fixed).

OUT.json: {"ok": true, "vllm_version", "load_s", "wall_s", "output_token_ids", "spec_counters":
{"num_drafts", "num_draft_tokens", "num_accepted_tokens"} | null} or {"ok": false, "error": one
line}. The exit status is 0 only with ok. Self-contained (the vLLM venv has no specctl).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

GiB = 1 << 30
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}


def build_llm(job: dict[str, Any]) -> Any:
    from vllm import LLM

    speculative_config = None
    if job.get("draft"):
        speculative_config = {
            "method": "draft_model",
            "model": str(job["draft"]),
            "num_speculative_tokens": int(job["num_speculative_tokens"]),
        }
    return LLM(
        model=str(job["target"]),
        dtype=job.get("dtype", "float32"),
        speculative_config=speculative_config,
        gpu_memory_utilization=float(job.get("gpu_memory_utilization", 0.3)),
        kv_cache_memory_bytes=int(float(job.get("kv_cache_gib", 1)) * GiB),
        max_model_len=job.get("max_model_len"),
        max_num_seqs=max(1, int(job.get("concurrency", 1))),
        enforce_eager=bool(job.get("enforce_eager", True)),
        enable_prefix_caching=bool(job.get("enable_prefix_caching", False)),
        skip_tokenizer_init=not job.get("prompts_text"),
        disable_log_stats=False,  # keeps the Prometheus spec-decode counters that get_metrics reads
        seed=0,
    )


def prompts_of(job: dict[str, Any]) -> list[Any]:
    from vllm.inputs import TokensPrompt

    prompts: list[Any] = [
        TokensPrompt(prompt_token_ids=list(ids)) for ids in job.get("prompts_token_ids") or []
    ]
    prompts.extend(job.get("prompts_text") or [])
    if not prompts:
        raise ValueError("job has neither prompts_token_ids nor prompts_text")
    return prompts


def sampling(max_tokens: int, detokenize: bool, temperature: float = 0.0) -> Any:
    from vllm import SamplingParams

    return SamplingParams(
        temperature=temperature, max_tokens=max_tokens, ignore_eos=True, detokenize=detokenize
    )


def generate(llm: Any, prompts: list[Any], params: Any, concurrency: int) -> list[list[int]]:
    """Token ids per prompt: one request at a time, or all at once for the scheduler to batch."""
    if concurrency <= 1:
        outputs = [out for p in prompts for out in llm.generate([p], params, use_tqdm=False)]
    else:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outputs]


def spec_counters(llm: Any) -> dict[str, float]:
    """The spec-decode counters summed over label sets (engines); empty without speculation."""
    totals: dict[str, float] = {}
    for metric in llm.get_metrics():
        key = SPEC_COUNTERS.get(metric.name.removesuffix("_total"))
        if key is not None and hasattr(metric, "value"):
            totals[key] = totals.get(key, 0.0) + float(metric.value)
    return totals


def counter_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float] | None:
    if not after:
        return None
    return {key: after[key] - before.get(key, 0.0) for key in after}


def run(job: dict[str, Any]) -> dict[str, Any]:
    import vllm

    start = time.perf_counter()
    llm = build_llm(job)
    load_s = time.perf_counter() - start
    prompts = prompts_of(job)
    max_tokens, concurrency = int(job["max_tokens"]), int(job.get("concurrency", 1))
    detokenize = bool(job.get("prompts_text"))
    temperature = float(job.get("temperature", 0.0))
    warmup = sampling(min(max_tokens, int(job.get("warmup_tokens", 8))), detokenize, temperature)
    generate(llm, prompts[:1], warmup, 1)
    before = spec_counters(llm)
    start = time.perf_counter()
    outputs = generate(llm, prompts, sampling(max_tokens, detokenize, temperature), concurrency)
    wall_s = time.perf_counter() - start
    return {
        "ok": True,
        "vllm_version": vllm.__version__,
        "load_s": load_s,
        "wall_s": wall_s,
        "output_token_ids": outputs,
        "spec_counters": counter_delta(before, spec_counters(llm)),
    }


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or "no message"
    return f"{type(error).__name__}: {text}"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: vllm_peer.py JOB.json OUT.json", file=sys.stderr)
        return 2
    out_path = Path(argv[2])
    try:
        result = run(json.loads(Path(argv[1]).read_text()))
    except Exception as error:  # the caller wants one line saying why, not a traceback
        result = {"ok": False, "error": one_line(error)}
        print(f"vllm peer failed: {result['error']}", file=sys.stderr)
    out_path.write_text(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":  # vLLM's CPU engine spawns workers that re-import this module
    sys.exit(main(sys.argv))
