"""`specctl generate`: speculative generation on one machine."""

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from daemon.runtime.engine.builder import BuiltEngine, EngineSpec, build_engine
from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.request import Request, RequestOutput
from daemon.runtime.engine.stop import truncate_at_stop
from daemon.runtime.errors import RequestError
from daemon.runtime.sampling.params import SamplingParams
from daemon.runtime.text_checks import lone_surrogate_at

DEFAULT_ADAPTIVE_MAX_K = 8
DEFAULT_FIXED_K = 4


@dataclass(slots=True)
class GenerateOptions:
    target: Path
    draft: Path | None
    ngram: bool
    prompts: list[str]
    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    num_speculative_tokens: int | None = None
    adaptive: bool = False
    dtype: str = "auto"
    ignore_eos: bool = False
    max_batch_size: int = 16
    backend: str = "auto"
    as_json: bool = False


def read_prompts(prompt: list[str] | None, prompt_file: Path | None) -> list[str]:
    """Prompts from --prompt (repeatable) or --prompt-file (one per line; .jsonl: {"prompt"})."""
    if bool(prompt) == (prompt_file is not None):
        raise RequestError("give either --prompt or --prompt-file (exactly one of them)")
    if prompt:
        for i, text in enumerate(prompt):
            _check_text(text, f"--prompt #{i + 1}")
        return list(prompt)
    assert prompt_file is not None
    try:
        text = prompt_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise RequestError(f"--prompt-file {prompt_file}: cannot read ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise RequestError(
            f"--prompt-file {prompt_file}: not UTF-8 text (byte {exc.start})"
        ) from None
    # lines end at "\n" alone: str.splitlines() also split at U+2028, U+0085, form feeds, which
    # JSON keeps raw inside strings and a text prompt may hold
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if prompt_file.suffix.lower() in (".jsonl", ".ndjson"):
        prompts = [
            _jsonl_prompt(prompt_file, n, line) for n, line in enumerate(lines, 1) if line.strip()
        ]
    else:
        prompts = [line for line in lines if line.strip()]
    if not prompts:
        raise RequestError(f"--prompt-file {prompt_file}: no prompts in it")
    return prompts


def _check_text(text: str, where: str) -> None:
    """A prompt the tokenizer can take: bytes that are not UTF-8 reach Python as lone
    surrogates (an argument decoded with surrogateescape), and the tokenizer raised on them."""
    if (at := lone_surrogate_at(text)) is not None:
        raise RequestError(f"{where}: not valid UTF-8 text (character {at})")


def _jsonl_prompt(path: Path, line_no: int, line: str) -> str:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        raise RequestError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from exc
    if not isinstance(value, dict) or not isinstance(value.get("prompt"), str):
        raise RequestError(f'{path}:{line_no}: expected an object with a string field "prompt"')
    _check_text(value["prompt"], f"{path}:{line_no}")
    return value["prompt"]


def engine_config(opts: GenerateOptions) -> EngineConfig:
    return speculation_config(
        draft=opts.draft,
        ngram=opts.ngram,
        num_speculative_tokens=opts.num_speculative_tokens,
        adaptive=opts.adaptive,
        max_batch_size=opts.max_batch_size,
    )


def speculation_config(
    *,
    draft: Path | None,
    ngram: bool,
    num_speculative_tokens: int | None,
    adaptive: bool,
    max_batch_size: int,
    prefill_chunk_tokens: int | None = None,
) -> EngineConfig:
    """The engine settings of the CLI's speculation options (shared by generate and serve)."""
    speculating = draft is not None or ngram
    if num_speculative_tokens is not None:
        k = num_speculative_tokens
    else:
        k = DEFAULT_ADAPTIVE_MAX_K if adaptive else DEFAULT_FIXED_K
    if num_speculative_tokens is not None and not speculating and k > 0:
        raise RequestError("--num-speculative-tokens needs --draft or --ngram")
    return EngineConfig(
        max_batch_size=max_batch_size,
        num_speculative_tokens=k if speculating else 0,
        adaptive=adaptive,
        prefill_chunk_tokens=prefill_chunk_tokens,
    )


def run_generate(opts: GenerateOptions) -> list[RequestOutput]:
    config = engine_config(opts)
    params = SamplingParams(
        temperature=opts.temperature,
        top_p=opts.top_p,
        top_k=opts.top_k,
        max_tokens=opts.max_tokens,
        seed=opts.seed,
        stop=opts.stop,
        stop_token_ids=opts.stop_token_ids,
        ignore_eos=opts.ignore_eos,
    )
    built = build_engine(
        EngineSpec(
            target=opts.target,
            draft=opts.draft,
            ngram=opts.ngram,
            dtype=opts.dtype,
            backend=opts.backend,
            engine=config,
        )
    )
    requests = [
        Request(f"prompt-{i}", built.tokenizer.encode(text), params)
        for i, text in enumerate(opts.prompts)
    ]
    start = time.perf_counter()
    outputs = built.engine.generate(requests)
    wall_s = time.perf_counter() - start
    for text, out in zip(opts.prompts, outputs, strict=True):
        _print_output(built, text, out, opts)
    _print_summary(built, outputs, wall_s)
    return outputs


def _print_output(
    built: BuiltEngine, prompt: str, out: RequestOutput, opts: GenerateOptions
) -> None:
    text = truncate_at_stop(
        built.tokenizer.decode(out.token_ids, skip_special_tokens=True), opts.stop
    )
    if not opts.as_json:
        print(prompt + text, flush=True)
        return
    record = {
        "prompt": prompt,
        "text": text,
        "token_ids": out.token_ids,
        "finish_reason": out.finish_reason,
        "num_prompt_tokens": len(out.prompt_token_ids),
        "num_generated_tokens": len(out.token_ids),
        "num_draft_tokens": out.num_draft_tokens,
        "num_accepted_tokens": out.num_accepted_tokens,
        "acceptance_rate": round(out.acceptance_rate, 4),
        "num_rounds": out.num_rounds,
        "tokens_per_s": round(out.tokens_per_s, 2),
    }
    print(json.dumps(record), flush=True)


def _print_summary(built: BuiltEngine, outputs: list[RequestOutput], wall_s: float) -> None:
    stats = built.engine.stats
    num_tokens = sum(len(o.token_ids) for o in outputs)
    proposer = built.engine.proposer.name if built.engine.proposer else "none (target only)"
    lines = [
        f"proposer: {proposer}",
        f"generated {num_tokens} tokens for {len(outputs)} prompt(s) in {wall_s:.2f} s: "
        f"{num_tokens / max(wall_s, 1e-9):.1f} tokens/s",
    ]
    if stats.num_draft_tokens:
        lines.append(
            f"acceptance rate {stats.acceptance_rate:.3f} "
            f"({stats.num_accepted_tokens}/{stats.num_draft_tokens} draft tokens), "
            f"mean acceptance length {stats.mean_acceptance_length:.2f}"
        )
    lines.append(
        f"time: draft {stats.draft_time_s:.2f} s, verify {stats.verify_time_s:.2f} s, "
        f"prefill {stats.prefill_time_s:.2f} s, engine overhead {stats.overhead_time_s:.2f} s "
        f"over {stats.num_rounds} rounds"
    )
    for line in lines:
        print(line, file=sys.stderr, flush=True)
