"""`specctl apply`, `specctl status` and `specctl down`: the control plane from a shell.

Each is a thin layer over specctl/apply (the same functions the TUI runs): progress goes to
stderr (or JSON lines to stdout with `--json`), the result to stdout, failures to one clear
message and a non-zero exit.
"""

import contextlib
import json
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from rich.table import Table

from specctl.apply.status import StatusReport, read_status
from specctl.apply.watch_record import WatchRecord, WatchRunning, holding_watch
from specctl.console import make_console
from specctl.home import SpecctlHome

if TYPE_CHECKING:
    from specctl.apply.apply import ApplyOptions, ApplyResult
    from specctl.apply.watch import StopEvent
    from specctl.commands.apply_view import ConsoleEvents, JsonEvents

EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_DEGRADED = 3  # status: applied, but not all of it serving (a shard down, no server)
EXIT_WATCHED = 4  # apply --watch: another watch keeps this home (nothing applied)
# apply --watch, asked to stop (a signal: Ctrl+C, its service stopped, `specctl down`) during
# its first apply, which then failed: a failure, but not one its service should start again
EXIT_STOPPED = 5


def run_apply(
    config_file: Path, as_json: bool, load_timeout_s: float, watch_s: float | None = None
) -> int:
    """`watch_s`: after the apply, keep what was applied running, looking every `watch_s`
    seconds, until SIGINT or SIGTERM (specctl/apply/watch.py). Those signals let an apply
    under way finish, the first one too (a second SIGINT interrupts it)."""
    from specctl.apply.apply import ApplyOptions, apply_deployment
    from specctl.apply.watch import stop_on_signals
    from specctl.commands.apply_view import ConsoleEvents, JsonEvents
    from specctl.config.errors import ConfigError

    home = SpecctlHome.resolve()
    out = sys.stdout
    events = JsonEvents(out) if as_json else ConsoleEvents()
    options = ApplyOptions(load_timeout_s=load_timeout_s)
    stop = None
    with contextlib.ExitStack() as held:
        # with --json, stdout holds JSON lines alone: what Ray prints there from its threads
        # at any moment (a node marked dead, say) goes to stderr
        if as_json:
            held.enter_context(contextlib.redirect_stdout(sys.stderr))
        record = None
        if watch_s is not None:
            # the home held as its watch before anything is applied (two watches would repair
            # each fault twice), and the signals that end a watch let that apply finish
            watched = holding_watch(home, watch_s, str(config_file.resolve()))
            try:
                record = held.enter_context(watched)
            except WatchRunning as exc:
                return _failed(str(exc), as_json, EXIT_WATCHED, out=out)
            except OSError as exc:  # the home not writable, say
                return _failed(f"cannot record the watch: {exc}", as_json, EXIT_FAILED, out=out)
            stop = held.enter_context(stop_on_signals())
        try:
            with events:
                result = apply_deployment(config_file, home, events, options)
        except ConfigError as exc:  # one line per issue, each with its file:line: field
            # nodes that did not answer are a failure to reach them, not an invalid file
            code = EXIT_FAILED if exc.unreachable else EXIT_INVALID
            code = _failed(str(exc), as_json, code, every_line=True, out=out)
        except Exception as exc:  # every failure of a step is said in one message
            code = _failed(_why(exc), as_json, EXIT_FAILED, out=out)
        else:
            _print_applied(result, as_json, out)
            if stop is None or record is None:
                return 0
            return _watch(home, events, options, record, stop, as_json, out)
    # the signals' own handlers are back: a SIGTERM from here on ends the process (which a
    # service takes for a stop), and one before it is seen in `stop.asked`
    return _failure_code(code, stop)


def _failure_code(code: int, stop: "StopEvent | None") -> int:
    """A failed apply's exit code: EXIT_STOPPED in place of EXIT_FAILED where a watch was
    asked to stop meanwhile (its service does not restart that: it would apply the file
    again after a `specctl down`); an invalid file stays EXIT_INVALID."""
    return EXIT_STOPPED if code == EXIT_FAILED and stop is not None and stop.asked else code


def _watch(
    home: SpecctlHome,
    events: "ConsoleEvents | JsonEvents",
    options: "ApplyOptions",
    record: WatchRecord,
    stop: threading.Event,
    as_json: bool,
    out: TextIO,
) -> int:
    """Until `stop` is set (by SIGINT or SIGTERM, maybe during the first apply already);
    the exit code."""
    from specctl.apply.apply import apply_deployment
    from specctl.apply.watch import WatchError, watch

    def repair(path: Path, text: str) -> object:
        with events:  # (a fresh progress display per repair)
            return apply_deployment(path, home, events, options, as_applied=text)

    try:
        watch(home, events, repair, record.interval_s, stop, record)
    except WatchError as exc:
        return _failed(str(exc), as_json, EXIT_FAILED, out=out)
    return 0


def _print_applied(result: "ApplyResult", as_json: bool, out: TextIO) -> None:
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
            ),
            file=out,
            flush=True,
        )
    else:
        console = make_console()
        console.print(
            f"endpoint: [bold]{result.endpoint}[/]  (deployment {result.plan.deployment})"
        )
        console.print(f"changed: {changed}")
        console.print("status: specctl status   stop: specctl down")
    sys.stdout.flush()  # a watch follows: a pipe reading this would wait for it to end


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
        watching = WatchRecord(**report.watch).describe() if report.watch else "none"
        console.print(f"watch      {watching}", highlight=False)
        console.print(_shard_table(report))
        console.print(_live_line(report))
    elif report.watch:  # one in its first apply
        console.print(f"watch      {WatchRecord(**report.watch).describe()}", highlight=False)
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


def _failed(
    message: str, as_json: bool, code: int, every_line: bool = False, out: TextIO | None = None
) -> int:
    """The outcome (with --json, to `out`: stdout) and the error on stderr; `every_line`: each
    line of the message is an error of its own (a config file's issues), prefixed as `plan`
    does."""
    if as_json:
        # flushed: a SIGTERM once the handlers are back ends the process before stdout's buffer
        out_json = json.dumps({"kind": "outcome", "is_ok": False, "message": message})
        print(out_json, file=out, flush=True)
    lines = message.splitlines() if every_line else [message]
    for line in lines:
        print(f"specctl: error: {line}", file=sys.stderr)
    return code
