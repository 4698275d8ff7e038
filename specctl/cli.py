"""The `specctl` command line. Each command lives in its own module under specctl/commands/
and is imported only when run, so `specctl --help` stays fast and the headless core never
imports textual.

`specctl` with no command opens the TUI (`tui/`), and so does `specctl FILE.toml`: a first
argument that is not a command is the cluster file to open."""

import math
import sys
from pathlib import Path
from typing import NoReturn

import click
import typer
from typer.core import TyperGroup

from daemon.cluster_token import CLIENT_TOKEN_FILE
from specctl.apply.watch_record import DEFAULT_TUI_INTERVAL_S, MAX_INTERVAL_S, MIN_INTERVAL_S

TUI_COMMAND = "tui"
MAX_BENCH_TEMPERATURE = 2.0  # a bench past it measures noise, not a workload anyone serves


class _OpensTuiByDefault(TyperGroup):
    """`specctl FILE [--models-dir D]` is `specctl tui FILE [--models-dir D]`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        first = args[0] if args else None
        if first is not None and first not in self.commands and first not in ctx.help_option_names:
            if not first.startswith("-") and not Path(first).exists():
                commands = ", ".join(sorted(set(self.commands) - {TUI_COMMAND}))
                fail(f"{first}: neither a command nor a file (commands: {commands})")
            args = [TUI_COMMAND, *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_OpensTuiByDefault,
    invoke_without_command=True,
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="specctl: speculative decoding across unequal GPU machines. "
    "With no command (or a cluster file), opens the TUI.",
)


WATCH_INTERVALS = f"a number of seconds from {MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g} (a day)"


def _is_watch_interval(seconds: float) -> bool:
    """NaN fails both comparisons; past a day is refused (past ~9e9 s the wait overflows)."""
    return MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a user-facing error (no traceback) and exit."""
    print(f"specctl: error: {message}", file=sys.stderr)
    raise typer.Exit(code)


@app.callback()
def open_tui_without_command(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:
        tui_command(None, [], DEFAULT_TUI_INTERVAL_S)


@app.command(
    TUI_COMMAND,
    help="Open the TUI on FILE (default: ./cluster.toml, else the embedded examples/local.toml).",
)
def tui_command(
    config_file: Path | None = typer.Argument(None, help="The cluster file to open."),
    models_dir: list[Path] = typer.Option(
        [], "--models-dir", help="Also look for models here (repeatable; $SPECCTL_MODEL_PATH too)."
    ),
    watch_interval_s: float = typer.Option(
        DEFAULT_TUI_INTERVAL_S,
        "--watch-interval",
        metavar="SECONDS",
        help="How often a watch started from Launch (w) looks at the deployment.",
    ),
) -> None:
    if config_file is not None and not config_file.is_file():
        what = "a directory, not a cluster file" if config_file.is_dir() else "no such file"
        fail(f"{config_file}: {what}")
    if not _is_watch_interval(watch_interval_s):
        fail(f"--watch-interval must be {WATCH_INTERVALS}, got {watch_interval_s}")
    from tui.main import run_tui

    run_tui(config_file, tuple(models_dir), watch_interval_s)


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


@app.command("serve", help="Serve the OpenAI-compatible endpoint over the engine on this machine.")
def serve_command(
    target: Path | None = typer.Option(None, "--target", help="Target (verifier) model directory."),
    draft: Path | None = typer.Option(None, "--draft", help="Draft model directory."),
    ngram: bool = typer.Option(False, "--ngram", help="Propose by n-gram / prompt lookup."),
    num_speculative_tokens: int | None = typer.Option(
        None, "--num-speculative-tokens", "-k", help="Fixed k (or the ceiling with --adaptive)."
    ),
    adaptive: bool = typer.Option(False, "--adaptive", help="Choose k per sequence and round."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port"),
    api_key_file: Path | None = typer.Option(
        None, "--api-key-file", help="File (mode 600) holding the key /v1/* requires."
    ),
    served_model_name: str | None = typer.Option(
        None, "--served-model-name", help="The name clients use (default: --target as given)."
    ),
    max_batch_size: int = typer.Option(16, "--max-batch-size", help="Running requests at most."),
    prefill_chunk_tokens: int | None = typer.Option(
        None,
        "--prefill-chunk-tokens",
        help="Prompt tokens prefilled per step while others decode, by the target and then "
        "the draft (default: whole prompts).",
    ),
    max_waiting: int = typer.Option(
        256, "--max-waiting", help="Queued requests beyond the batch before 429s."
    ),
    max_model_len: int | None = typer.Option(
        None, "--max-model-len", help="Prompt + output tokens per request (default: the model's)."
    ),
    dtype: str = typer.Option("auto", "--dtype", help="auto|float32|bfloat16|float16"),
    backend: str = typer.Option("auto", "--backend", help="auto|lean|hf"),
    graceful_timeout_s: float = typer.Option(
        10.0, "--graceful-timeout-s", help="On SIGINT/SIGTERM, time for requests to finish."
    ),
    log_level: str = typer.Option("info", "--log-level", help="debug|info|warning|error"),
    threads: int | None = typer.Option(
        None, "--threads", help="CPU threads for torch (default: torch's own choice)."
    ),
    deployment: Path | None = typer.Option(
        None,
        "--deployment",
        help="Serve an applied deployment's shards (its state.json; what `specctl apply` runs).",
    ),
) -> None:
    from daemon.runtime.errors import SpecError
    from specctl.commands.serve import ServeOptions, run_serve

    try:
        run_serve(
            ServeOptions(
                target=target,
                draft=draft,
                ngram=ngram,
                num_speculative_tokens=num_speculative_tokens,
                adaptive=adaptive,
                host=host,
                port=port,
                api_key_file=api_key_file,
                served_model_name=served_model_name,
                max_batch_size=max_batch_size,
                prefill_chunk_tokens=prefill_chunk_tokens,
                max_waiting=max_waiting,
                max_model_len=max_model_len,
                dtype=dtype,
                backend=backend,
                graceful_timeout_s=graceful_timeout_s,
                log_level=log_level,
                threads=threads,
                deployment=deployment,
            )
        )
    except SpecError as exc:
        fail(str(exc))


@app.command(
    "demo",
    help="The main job: apply examples/local.toml (drafter and verifier on two local Ray nodes), "
    "send requests through the endpoint, print acceptance rate and tokens/s; leaves it up.",
)
def demo_command(
    config: Path | None = typer.Option(
        None, "--config", help="Cluster file to apply (default: examples/local.toml)."
    ),
    num_prompts: int = typer.Option(8, "--num-prompts", help="Held-out code prompts to send."),
    max_tokens: int = typer.Option(64, "--max-tokens"),
    concurrency: int = typer.Option(4, "--concurrency", help="Requests in flight at once."),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
) -> None:
    from daemon.runtime.errors import SpecError
    from specctl.commands.demo import DEFAULT_CONFIG, DemoError, run_demo

    for name, value in (
        ("--num-prompts", num_prompts),
        ("--max-tokens", max_tokens),
        ("--concurrency", concurrency),
    ):
        if value < 1:
            fail(f"{name} must be >= 1, got {value}")
    try:
        run_demo(config or DEFAULT_CONFIG, num_prompts, max_tokens, concurrency, as_json)
    except (DemoError, SpecError) as exc:
        fail(str(exc), code=1)


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
    k: int = typer.Option(
        4, "--num-speculative-tokens", "-k", help="The peers' k and the analytic bound's."
    ),
    sweep: str = typer.Option(
        "1,2,4,6", "--ks", help="Fixed k values run beside adaptive (its ceiling: the largest)."
    ),
    shape: str = typer.Option(
        "both",
        "--shape",
        help="Cost-scaled demo target: narrow (many small layers), wide (weight-read-bound "
        "MLPs), or both. Ignored with --target.",
    ),
    concurrency: str = typer.Option("1,4,16,32", "--concurrency", help="Comma-separated."),
    peers: bool = typer.Option(True, "--peers/--no-peers", help="Also run transformers and vLLM."),
    out_dir: Path = typer.Option(Path(".bench-out"), "--out", help="JSON, PNG and model cache."),
    threads: int | None = typer.Option(
        None, "--threads", help="CPU threads for every engine (torch, and vLLM's OpenMP)."
    ),
    repeats: int = typer.Option(
        3, "--repeats", help="Measured runs per specctl configuration; the median is reported."
    ),
    device: str = typer.Option(
        "cpu", "--device", help="cpu or cuda: where specctl and transformers run."
    ),
    temperature: float = typer.Option(
        0.0,
        "--temperature",
        help="0: greedy, every engine's outputs compared with target-only's. Above 0: every "
        "engine samples at it (specctl's requests seeded), speculation with the default "
        "proposal (its top tokens and a tail, or coupled drafts where the engine measures "
        "them faster).",
    ),
) -> None:
    from bench.arg_types import device_problem
    from daemon.runtime.errors import SpecError
    from specctl.commands.bench import default_config, run_bench_command

    if shape not in ("narrow", "wide", "both"):
        fail(f"--shape must be narrow, wide or both, got {shape!r}")
    concurrencies = _int_list("--concurrency", concurrency, minimum=1)
    sweep_ks = _int_list("--ks", sweep, minimum=1)
    if k < 1:
        fail(f"-k/--num-speculative-tokens must be >= 1, got {k}")
    if repeats < 1:
        fail(f"--repeats must be >= 1, got {repeats}")
    if not 0.0 <= temperature <= MAX_BENCH_TEMPERATURE:
        fail(f"--temperature must be in [0, {MAX_BENCH_TEMPERATURE:g}], got {temperature:g}")
    problem = device_problem(device)
    if problem:
        fail(problem)
    try:
        cfg = default_config(out_dir, draft)
        cfg.num_prompts, cfg.max_tokens, cfg.k, cfg.peers = num_prompts, max_tokens, k, peers
        cfg.concurrencies, cfg.sweep_ks, cfg.threads = concurrencies, sweep_ks, threads
        cfg.repeats, cfg.device, cfg.temperature = repeats, device, temperature
        run_bench_command(cfg, target, cost_ratio, shape)
    except SpecError as exc:
        fail(str(exc))


def _int_list(option: str, text: str, minimum: int) -> list[int]:
    try:
        values = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        fail(f"{option} must list integers separated by commas, got {text!r}")
    if not values or any(v < minimum for v in values):
        fail(f"{option} must list integers >= {minimum}, got {text!r}")
    return values


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
    if not (math.isfinite(timeout_s) and timeout_s > 0):  # NaN and inf pass a comparison
        fail(f"--timeout must be a finite number > 0 (seconds), got {timeout_s}")
    run_plan(
        config_file, as_json, "probe" if probe else "offline" if offline else "auto", timeout_s
    )


@app.command(
    "apply",
    help="Bring the cluster, the shards and the endpoint to what the cluster file asks "
    "(idempotent: a second apply of the same file changes nothing). Exit 0: applied (with "
    "--watch: the watch stopped when asked, or by `specctl down`); 1: a step failed (a node "
    "unreachable, a shard that would not load); 2: the file is invalid; 4: --watch, and "
    "another watch keeps this home's deployment (nothing applied); 5: --watch, asked to stop "
    "during its first apply, which failed (an invalid file: still 2).",
)
def apply_command(
    config_file: Path = typer.Argument(..., help="The cluster file (cluster.toml)."),
    as_json: bool = typer.Option(False, "--json", help="Progress and outcome as JSON lines."),
    load_timeout_s: float = typer.Option(
        900.0, "--load-timeout", help="Seconds every shard has to load its weights."
    ),
    watch_s: float | None = typer.Option(
        None,
        "--watch",
        metavar="SECONDS",
        help="Then keep what was applied running: look every SECONDS, apply it again where "
        "something stays broken (a dead raylet, a shard gone), until Ctrl+C.",
    ),
) -> None:
    from specctl.commands.deployment import run_apply

    if not (math.isfinite(load_timeout_s) and load_timeout_s > 0):  # NaN waited for ever
        fail(f"--load-timeout must be a finite number > 0 (seconds), got {load_timeout_s}")
    if watch_s is not None and not _is_watch_interval(watch_s):
        fail(f"--watch must be {WATCH_INTERVALS}, got {watch_s}")
    raise typer.Exit(run_apply(config_file, as_json, load_timeout_s, watch_s))


@app.command(
    "status",
    help="The deployment: endpoint, shards with role and node, live figures. Exit 0: all of "
    "it serving; 3: applied, but a shard or the server is not ready; 1: nothing applied.",
)
def status_command(
    as_json: bool = typer.Option(False, "--json", help="Print JSON (endpoint, shards, live)."),
) -> None:
    from specctl.commands.deployment import run_status

    raise typer.Exit(run_status(as_json))


@app.command(
    "down",
    help="Stop everything apply started (the home's watch first, then the serving process, "
    "the shards and the Ray nodes); leave no process behind. Exit 1 where a process would "
    "not stop (the watch: another user's, say), once the rest is down.",
)
def down_command(
    as_json: bool = typer.Option(False, "--json", help="Progress and outcome as JSON lines."),
) -> None:
    from specctl.commands.deployment import run_down

    raise typer.Exit(run_down(as_json))


def main() -> None:
    from specctl.quiet_exit import run_and_exit

    run_and_exit(app)


if __name__ == "__main__":
    main()
