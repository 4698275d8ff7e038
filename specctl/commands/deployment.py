"""`specctl apply`, `specctl status` and `specctl down`: the control plane from a shell.

Each is a thin layer over specctl/apply (the same functions the TUI runs): progress goes to
stderr (or JSON lines to stdout with `--json`), the result to stdout, failures to one clear
message and a non-zero exit.
"""

import json
import sys
from pathlib import Path

from rich.table import Table

from specctl.apply.status import StatusReport, read_status
from specctl.console import make_console
from specctl.home import SpecctlHome

EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_DEGRADED = 3  # status: applied, but not all of it serving (a shard down, no server)


def run_apply(config_file: Path, as_json: bool, load_timeout_s: float) -> int:
    from specctl.apply.apply import ApplyOptions, apply_deployment
    from specctl.commands.apply_view import ConsoleEvents, JsonEvents
    from specctl.config.errors import ConfigError

    home = SpecctlHome.resolve()
    events = JsonEvents() if as_json else ConsoleEvents()
    try:
        with events:
            result = apply_deployment(
                config_file, home, events, ApplyOptions(load_timeout_s=load_timeout_s)
            )
    except ConfigError as exc:  # one line per issue, each with its file:line: field
        return _failed(str(exc), as_json, EXIT_INVALID, every_line=True)
    except Exception as exc:  # every failure of a step is said in one message
        return _failed(_why(exc), as_json, EXIT_FAILED)
    changed = ", ".join(result.changed) if result.changed else "nothing (already as asked)"
    if as_json:
        print(
            json.dumps(
                {
                    "kind": "outcome",
                    "is_ok": True,
                    "endpoint": result.endpoint,
                    "changed": result.changed,
                    "deployment_id": result.deployment_id,
                }
            )
        )
    else:
        console = make_console()
        console.print(
            f"endpoint: [bold]{result.endpoint}[/]  (deployment {result.plan.deployment})"
        )
        console.print(f"changed: {changed}")
        console.print("status: specctl status   stop: specctl down")
    return 0


def run_down(as_json: bool) -> int:
    from specctl.apply.down import take_down
    from specctl.commands.apply_view import ConsoleEvents, JsonEvents

    home = SpecctlHome.resolve()
    events = JsonEvents() if as_json else ConsoleEvents()
    try:
        with events:
            leftover = take_down(home, events)
    except Exception as exc:
        return _failed(_why(exc), as_json, EXIT_FAILED)
    if leftover:
        return _failed(f"processes still alive after down: {leftover}", as_json, EXIT_FAILED)
    if as_json:
        print(json.dumps({"kind": "outcome", "is_ok": True}))
    else:
        make_console().print("everything apply started is stopped")
    return 0


def run_status(as_json: bool) -> int:
    report = read_status(SpecctlHome.resolve())
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print_status(report)
    if report.deployment is None:
        return EXIT_FAILED
    return 0 if report.is_healthy else EXIT_DEGRADED


def _print_status(report: StatusReport) -> None:
    console = make_console()
    if report.deployment is not None:
        server = (
            f"pid {report.server_pid}, {report.server_status or 'not answering'}"
            if report.is_server_alive
            else "not running"
        )
        console.print(f"deployment [bold]{report.deployment}[/] ({report.config_path})")
        endpoint = report.endpoint or "none yet (the apply did not get to the server)"
        console.print(f"endpoint   {endpoint}  model {report.served_model_name!r}")
        console.print(f"server     {server}")
        console.print(_shard_table(report))
        console.print(_live_line(report))
    for problem in report.problems:
        console.print(f"[yellow]![/] {problem}", highlight=False)


def _shard_table(report: StatusReport) -> Table:
    table = Table("shard", "role", "node", "running on", "state", "pid")
    for s in report.shards:
        state = s.state if not s.error else f"{s.state}: {s.error}"
        table.add_row(s.id, s.role, s.node, s.running_on or "-", state, str(s.pid or "-"))
    return table


def _live_line(report: StatusReport) -> str:
    live = report.live
    if live is None:
        return "live: no samples in the last minute"

    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    return (
        f"last {live.window_s:.0f} s: {live.tokens_per_s:.1f} tokens/s "
        f"({num(live.busy_tokens_per_s, '.1f')} while busy), "
        f"acceptance {num(live.acceptance_rate, '.3f')}, "
        f"mean acceptance length {num(live.mean_acceptance_length, '.2f')}, "
        f"k {num(live.k_in_use, '.1f')}, batch up to {live.batch_size}, "
        f"TTFT p50 {num(live.ttft_p50_ms, '.0f')} ms"
    )


def _why(error: BaseException) -> str:
    return str(error).strip() or type(error).__name__


def _failed(message: str, as_json: bool, code: int, every_line: bool = False) -> int:
    """The outcome (with --json) and the error on stderr; `every_line`: each line of the
    message is an error of its own (a config file's issues), prefixed as `plan` does."""
    if as_json:
        print(json.dumps({"kind": "outcome", "is_ok": False, "message": message}))
    lines = message.splitlines() if every_line else [message]
    for line in lines:
        print(f"specctl: error: {line}", file=sys.stderr)
    return code
