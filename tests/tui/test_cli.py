"""`specctl` opens the TUI (in a real terminal), `specctl FILE` opens that file, the
subcommands and --help still work, and a mistyped command is an error, not a TUI."""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tui.helpers import LOCAL_TOML, REPO
from tests.tui.terminal import TmuxTerminal

SPECCTL = [sys.executable, "-m", "specctl.cli"]


def specctl(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPECCTL, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_help_lists_the_commands_and_the_tui() -> None:
    result = specctl("--help")
    assert result.returncode == 0, result.stderr
    for command in ("tui", "plan", "generate", "init"):
        assert command in result.stdout
    assert "opens the TUI" in " ".join(result.stdout.split())


def test_subcommands_are_not_taken_for_files() -> None:
    result = specctl("plan", str(LOCAL_TOML), "--offline")
    assert result.returncode == 0, result.stderr
    assert "verifier demo-target" in result.stdout


def test_a_mistyped_command_is_an_error_naming_the_commands() -> None:
    result = specctl("plna", "cluster.toml")
    assert result.returncode == 2
    assert "specctl: error: plna: neither a command nor a file" in result.stderr
    assert (
        "commands: apply, bench, demo, down, generate, init, plan, serve, status" in result.stderr
    )
    assert "Traceback" not in result.stderr
    directory = specctl("tui", str(REPO))
    assert directory.returncode == 2
    assert "a directory, not a cluster file" in directory.stderr
    # a watch looking that often, or never (a wait past ~9e9 s overflows): refused
    for interval in ("0.1", "nan", "inf", "1e10"):
        for argv in (("tui", str(LOCAL_TOML), "--watch-interval"), ("apply", "x", "--watch")):
            refused = specctl(*argv, interval)
            assert refused.returncode == 2, refused.stderr
            seconds = "must be a number of seconds from 0.5 to 86400 (a day), got"
            assert f"{argv[-1]} {seconds} {float(interval)}" in refused.stderr
            assert "Traceback" not in refused.stderr


@pytest.fixture
def terminals() -> Iterator[list[TmuxTerminal]]:
    opened: list[TmuxTerminal] = []
    yield opened
    for terminal in opened:
        terminal.close()


def open_tui(terminals: list[TmuxTerminal], cwd: Path, home: Path, *args: str) -> TmuxTerminal:
    env = {"SPECCTL_HOME": str(home), "TERM": "xterm-256color", "PATH": os.environ["PATH"]}
    terminal = TmuxTerminal([*SPECCTL, *args], cwd, env, size=(100, 30))
    terminals.append(terminal)
    return terminal


def test_no_command_opens_the_embedded_default_or_the_local_file(
    tmp_path: Path, terminals: list[TmuxTerminal]
) -> None:
    terminal = open_tui(terminals, tmp_path, tmp_path / "home")
    terminal.wait_for("1 Nodes", "verifier-node", "drafter-node")
    terminal.press("3")
    terminal.wait_for("saves to cluster.toml")  # the shipped example stays as it is
    terminal.press("C-q")
    deadline = time.monotonic() + 15
    while terminal.is_running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not terminal.is_running()  # Ctrl+Q quits

    own = LOCAL_TOML.read_text().replace("verifier-node", "big-box").replace("../", f"{REPO}/")
    (tmp_path / "cluster.toml").write_text(own)
    terminal = open_tui(terminals, tmp_path, tmp_path / "home")
    terminal.wait_for("big-box", "drafter-node")


def test_a_file_argument_opens_that_file(tmp_path: Path, terminals: list[TmuxTerminal]) -> None:
    other = tmp_path / "other.toml"
    other.write_text(
        LOCAL_TOML.read_text().replace("../", f"{REPO}/").replace("drafter-node", "small-box")
    )
    terminal = open_tui(terminals, tmp_path, tmp_path / "home", str(other))
    terminal.wait_for("verifier-node", "small-box")
