"""`specctl plan cluster.toml`: validate, find out what the nodes have, plan, print. A dry run:
nothing is started, written or changed.

Exit status: 0 the plan fits; 1 it does not fit (the problems say which shard, where, by how
much, and what would help); 2 the file is invalid (one line per problem: file:line: field:
message); 3 the fit cannot be checked (a node's memory is unknown, or a model kept on its
nodes alone cannot be read because none of them answers).
"""

import textwrap
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specctl.config import ConfigError, load_config
from specctl.console import make_console
from specctl.planner import Plan, ProbeMode, ShardPlan, gather_node_facts, make_plan
from specctl.planner.gather import token_problems
from specctl.planner.wording import size

EXIT_FITS = 0
EXIT_DOES_NOT_FIT = 1
EXIT_INVALID = 2
EXIT_UNKNOWN = 3
_EXIT_CODES = {"fits": EXIT_FITS, "does_not_fit": EXIT_DOES_NOT_FIT, "unknown": EXIT_UNKNOWN}
_VERDICT_WORDS = {
    "fits": ("fits", "bold green"),
    "does_not_fit": ("does not fit", "bold red"),
    "unknown": ("fit unknown", "bold yellow"),
}


def run_plan(config_path: Path, as_json: bool, mode: ProbeMode, timeout_s: float) -> None:
    try:
        # a model kept on its nodes alone is read through them: not where told to ask none
        config = load_config(config_path, None if mode == "offline" else timeout_s)
    except ConfigError as error:
        for issue in error.issues:
            typer.echo(f"specctl: error: {issue}", err=True)
        # nodes down are not a mistake in the file: the fit is unknown until they answer
        raise typer.Exit(EXIT_UNKNOWN if error.unreachable else EXIT_INVALID) from None
    facts = gather_node_facts(config, mode=mode, timeout_s=timeout_s)
    plan = make_plan(config, facts)
    # the token files `apply` reads, checked here too (read, never made): without a node
    # to ask (declared hardware, --probe offline), a missing one showed only at apply
    plan.warnings += [f"apply would refuse it: {line}" for line in token_problems(config)]
    if as_json:
        typer.echo(plan.model_dump_json(indent=2))
    else:
        print_plan(plan, str(config_path), make_console())
    raise typer.Exit(_EXIT_CODES[plan.verdict])


def print_plan(plan: Plan, shown_path: str, console: Console) -> None:
    words, style = _VERDICT_WORDS[plan.verdict]
    title = Text.assemble(f"Plan for {shown_path} (deployment {plan.deployment}): ", (words, style))
    console.print(title)
    console.print(_shard_table(plan))
    for heading, style, lines in (
        ("Why", "bold", plan.explanation),
        ("Warnings", "bold yellow", plan.warnings),
        ("Problems", "bold red", plan.problems),
    ):
        if lines:
            console.print(Text(heading, style=style))
            for line in _bullets(lines, console.width):
                console.print(Text(line), soft_wrap=True)
    console.print(Text("Dry run: nothing was started or changed.", style="dim"))


def _bullets(lines: list[str], width: int) -> list[str]:
    """One bullet per line; a long line wraps under its own text, not under the bullet."""
    wrapped = []
    for line in lines:
        wrapped += textwrap.wrap(
            line,
            width=max(40, width - 1),
            initial_indent="  - ",
            subsequent_indent="    ",
            break_long_words=False,
            break_on_hyphens=False,
        )
    return wrapped


def _shard_table(plan: Plan) -> Table:
    table = Table(show_edge=False, pad_edge=False)
    for column in ("shard", "model", "node", "device", "layers", "TP"):
        table.add_column(column)
    for column in ("weights", "KV cache", "act.+runtime", "per rank", "free", "fit"):
        table.add_column(column, justify="right")
    for shard in plan.shards:
        memory = shard.memory_per_rank
        table.add_row(
            _shard_name(shard, plan.replicas),
            shard.model,
            shard.node,
            _device(shard),
            f"{shard.layer_start}-{shard.layer_end - 1}",
            str(shard.tensor_parallel_size),
            size(memory.weights_bytes),
            size(memory.kv_cache_bytes),
            size(memory.activation_bytes + memory.runtime_bytes),
            size(memory.total_bytes),
            size(shard.free_bytes),
            Text(*_fit(shard)),
        )
    return table


def _shard_name(shard: ShardPlan, num_replicas: int) -> str:
    name = shard.role
    if shard.role == "verifier" and shard.num_stages > 1:
        name += f" stage {shard.stage}"
    return f"{name} (replica {shard.replica})" if num_replicas > 1 else name


def _device(shard: ShardPlan) -> str:
    if shard.device == "cpu":
        return "CPU"
    return "GPU " + ",".join(map(str, shard.gpu_indices))


def _fit(shard: ShardPlan) -> tuple[str, str]:
    words, style = _VERDICT_WORDS[shard.verdict]
    return words, style.removeprefix("bold ")
