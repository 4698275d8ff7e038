"""The `specctl` command line. Each command lives in its own module under specctl/commands/
and is imported only when run, so `specctl --help` stays fast and the headless core never
imports textual."""

import sys
from pathlib import Path

import typer

from daemon.cluster_token import CLIENT_TOKEN_FILE

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="specctl: speculative decoding across unequal GPU machines.",
)


def fail(message: str, code: int = 2) -> None:
    """Print a user-facing error (no traceback) and exit."""
    print(f"specctl: error: {message}", file=sys.stderr)
    raise typer.Exit(code)


@app.command(
    "init", help="Create the cluster token (0600) and print how to install it on each node."
)
def init_command(
    token_file: str = typer.Option(
        CLIENT_TOKEN_FILE, "--token-file", help="Where to write the token."
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing token."),
) -> None:
    from specctl.commands.init import run_init

    run_init(token_file=token_file, force=force)


@app.command("generate", help="Generate on this machine, speculatively with --draft or --ngram.")
def generate_command(
    target: Path = typer.Option(..., "--target", help="Target (verifier) model directory."),
    draft: Path | None = typer.Option(None, "--draft", help="Draft model directory."),
    ngram: bool = typer.Option(False, "--ngram", help="Propose by n-gram / prompt lookup."),
    prompt: list[str] | None = typer.Option(None, "--prompt", help="Prompt text (repeatable)."),
    prompt_file: Path | None = typer.Option(
        None, "--prompt-file", help='One prompt per line, or .jsonl with a "prompt" field.'
    ),
    max_tokens: int = typer.Option(128, "--max-tokens"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 means greedy."),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k", help="0 disables top-k."),
    seed: int | None = typer.Option(None, "--seed"),
    stop: list[str] | None = typer.Option(None, "--stop", help="Stop string (repeatable)."),
    stop_token_id: list[int] | None = typer.Option(None, "--stop-token-id", help="Repeatable."),
    num_speculative_tokens: int | None = typer.Option(
        None, "--num-speculative-tokens", "-k", help="Fixed k (or the ceiling with --adaptive)."
    ),
    adaptive: bool = typer.Option(False, "--adaptive", help="Choose k per sequence and round."),
    dtype: str = typer.Option("auto", "--dtype", help="auto|float32|bfloat16|float16"),
    ignore_eos: bool = typer.Option(False, "--ignore-eos"),
    max_batch_size: int = typer.Option(16, "--max-batch-size"),
    backend: str = typer.Option("auto", "--backend", help="auto|lean|hf"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per prompt."),
) -> None:
    from daemon.runtime.errors import SpecError
    from specctl.commands.generate import GenerateOptions, read_prompts, run_generate

    try:
        opts = GenerateOptions(
            target=target,
            draft=draft,
            ngram=ngram,
            prompts=read_prompts(prompt, prompt_file),
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            stop=tuple(stop or ()),
            stop_token_ids=tuple(stop_token_id or ()),
            num_speculative_tokens=num_speculative_tokens,
            adaptive=adaptive,
            dtype=dtype,
            ignore_eos=ignore_eos,
            max_batch_size=max_batch_size,
            backend=backend,
            as_json=as_json,
        )
        run_generate(opts)
    except SpecError as exc:
        fail(str(exc))


@app.command("demo", help="The main job: speculative generation on the bundled demo pair.")
def demo_command(
    num_prompts: int = typer.Option(4, "--num-prompts", help="Held-out code prompts to run."),
    max_tokens: int = typer.Option(64, "--max-tokens"),
    k: int = typer.Option(4, "--num-speculative-tokens", "-k"),
    dtype: str = typer.Option("float32", "--dtype"),
) -> None:
    from daemon.runtime.errors import SpecError
    from specctl.commands.demo import run_demo

    try:
        run_demo(num_prompts, max_tokens, k, dtype)
    except SpecError as exc:
        fail(str(exc))


@app.command("bench", help="Benchmark specctl against target-only decoding and peer engines.")
def bench_command(
    target: Path | None = typer.Option(
        None, "--target", help="Target dir (default: the demo target, cost-scaled)."
    ),
    draft: Path | None = typer.Option(None, "--draft", help="Draft dir (default: the demo draft)."),
    cost_ratio: float = typer.Option(
        30.0, "--cost-ratio", help="Make the demo target this many times the draft's cost (0: off)."
    ),
    num_prompts: int = typer.Option(8, "--num-prompts"),
    max_tokens: int = typer.Option(64, "--max-tokens"),
    k: int = typer.Option(4, "--num-speculative-tokens", "-k"),
    concurrency: str = typer.Option("1,4,16,32", "--concurrency", help="Comma-separated."),
    peers: bool = typer.Option(True, "--peers/--no-peers", help="Also run transformers and vLLM."),
    out_dir: Path = typer.Option(Path(".bench-out"), "--out", help="JSON, PNG and model cache."),
    threads: int | None = typer.Option(
        None, "--threads", help="CPU threads for every engine (torch, and vLLM's OpenMP)."
    ),
) -> None:
    from daemon.runtime.errors import SpecError
    from specctl.commands.bench import default_config, run_bench_command

    try:
        cfg = default_config(out_dir, draft)
        cfg.num_prompts, cfg.max_tokens, cfg.k, cfg.peers = num_prompts, max_tokens, k, peers
        cfg.concurrencies = [int(c) for c in concurrency.split(",") if c.strip()]
        if not cfg.concurrencies or any(c < 1 for c in cfg.concurrencies):
            fail(f"--concurrency must list positive integers, got {concurrency!r}")
        cfg.threads = threads
        run_bench_command(cfg, target, cost_ratio)
    except ValueError as exc:
        fail(f"--concurrency must list positive integers ({exc})")
    except SpecError as exc:
        fail(str(exc))


@app.command(
    "plan",
    help="Validate a cluster file and print the placement and memory fit, in words; changes "
    "nothing. Exit 0: fits; 1: does not fit; 2: invalid file; 3: fit unknown.",
)
def plan_command(
    config_file: Path = typer.Argument(..., help="The cluster file (cluster.toml)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    probe: bool = typer.Option(
        False, "--probe", help="Ask every specd node for its inventory (declared: fallback)."
    ),
    offline: bool = typer.Option(
        False, "--offline", help="Ask no node; plan from the hardware declared in the file."
    ),
    timeout_s: float = typer.Option(3.0, "--timeout", help="Seconds to wait for each specd."),
) -> None:
    from specctl.commands.plan import run_plan

    if probe and offline:
        fail("--probe and --offline contradict each other; give one")
    if timeout_s <= 0:
        fail(f"--timeout must be > 0 seconds, got {timeout_s}")
    run_plan(
        config_file, as_json, "probe" if probe else "offline" if offline else "auto", timeout_s
    )


def main() -> None:
    from specctl.quiet_exit import run_and_exit

    run_and_exit(app)


if __name__ == "__main__":
    main()
