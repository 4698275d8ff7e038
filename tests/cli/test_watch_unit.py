"""The user unit that runs `specctl apply FILE --watch` (packaging/systemd): systemd accepts
it, its command line as the documented environment file expands it is one the CLI takes,
and the exit statuses its restart policy relies on are the CLI's: an invalid file (2) is not
tried again; a failed apply (1) is, but not a first apply that failed after the watch was
asked to stop (5: by `specctl down`, which would be undone)."""

import configparser
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.cluster_token import generate_token, write_token

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "packaging" / "systemd" / "specctl-watch.service"


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment, method-assign]
    parser.read(UNIT)
    return parser


def one_node_file(path: Path, specd: str, token_file: Path) -> Path:
    """A cluster file of one node at `specd` serving the demo target, drafted by n-grams."""
    path.write_text(
        f'[[nodes]]\nname = "a"\nspecd = "{specd}"\ntoken_file = "{token_file}"\n\n'
        f'[[models]]\nname = "m"\npath = "{ROOT / "packaging" / "demo-models" / "target"}"\n\n'
        '[deployment.verifier]\nmodel = "m"\nnodes = ["a"]\n\n'
        '[deployment.drafter]\nmodel = "ngram"\n'
    )
    return path


def test_the_deployment_outlives_the_watch_and_an_invalid_file_is_not_retried() -> None:
    service = _unit()["Service"]
    assert service["KillMode"] == "process"  # the Ray nodes and server its applies started
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"].split() == ["2", "4", "5", "126", "127"]
    assert service["OOMPolicy"] == "continue"
    assert service["EnvironmentFile"] == "%h/.config/specctl/watch.env"


def test_its_command_line_runs_specctl_with_the_exit_statuses_it_relies_on(
    tmp_path: Path,
) -> None:
    """The environment file as the unit's comment writes it; the command run as systemd
    would (split into words, then each ${VAR} word replaced whole: a path with a space is one
    argument), against files that make apply fail."""
    env_file = {
        "SPECCTL": str(Path(sys.executable).parent / "specctl"),
        "WATCH_SECONDS": "30",
    }
    command = _unit()["Service"]["ExecStart"]
    home = {**os.environ, "SPECCTL_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    tmp_path = tmp_path / "a dir"  # a space: one argument all the same
    tmp_path.mkdir()
    broken = tmp_path / "broken.toml"
    broken.write_text("[[nodes]]\nname = 1\n")
    # a node whose specd nothing answers: apply fails (1), and systemd tries again
    write_token(tmp_path / "t", generate_token(), force=False)
    down = one_node_file(tmp_path / "down.toml", "127.0.0.1:9", tmp_path / "t")
    cases = ((broken, 2, "broken.toml:2: nodes[0].name"), (down, 1, "specd at 127.0.0.1:9"))
    for cluster, status, said in cases:
        values = {**env_file, "CLUSTER_FILE": str(cluster)}
        argv = [re.sub(r"^\$\{(\w+)\}$", lambda m, v=values: v[m.group(1)], word)
                for word in command.split()]  # fmt: skip
        assert argv[:2] == ["/usr/bin/env", env_file["SPECCTL"]]
        assert argv[2:] == ["apply", str(cluster), "--watch", "30"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=home)
        assert done.returncode == status, done.stdout + done.stderr
        assert said in done.stderr, done.stderr


def test_a_watch_asked_to_stop_during_a_first_apply_that_fails_exits_5(tmp_path: Path) -> None:
    """SIGTERM (what `specctl down` sends a watch) while the first apply waits on a node's
    specd that accepts connections but never answers: that apply fails as it would have,
    and the watch exits 5, which its service does not start again; not 1, which it does
    (and which would apply the file again 30 s after the down)."""
    write_token(tmp_path / "t", generate_token(), force=False)
    with socket.socket() as silent:  # connections wait in its backlog, never answered
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        cluster = one_node_file(tmp_path / "silent.toml", f"127.0.0.1:{port}", tmp_path / "t")
        env = {**os.environ, "SPECCTL_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
        argv = [sys.executable, "-m", "specctl.cli", "apply", "--json", "--watch", "30"]
        watching = subprocess.Popen(
            [*argv, str(cluster)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert watching.stdout is not None
            first = json.loads(watching.stdout.readline())  # the apply has begun
            watching.send_signal(signal.SIGTERM)
            out, err = watching.communicate(timeout=120)
        finally:
            watching.kill()
    assert first["name"] == "validate", first
    assert watching.returncode == 5, out + err
    outcome = json.loads(out.splitlines()[-1])
    assert outcome["kind"] == "outcome" and not outcome["is_ok"], out
    said = f"specd at 127.0.0.1:{port} accepts connections but did not answer /health within"
    assert said in outcome["message"], outcome  # (not after `ray start`'s three minutes)


def test_a_stop_asked_as_the_failure_is_said_is_still_exit_5(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SIGTERM lands after the apply failed, as its outcome is printed, while the watch's
    handlers are still in place: exit 5 all the same (the code was decided before the outcome
    was printed, and came out 1). The apply is the real one, in this process, failing at once
    on a node whose specd refuses connections."""
    from specctl.commands import deployment

    write_token(tmp_path / "t", generate_token(), force=False)
    cluster = one_node_file(tmp_path / "refused.toml", "127.0.0.1:9", tmp_path / "t")
    monkeypatch.setenv("SPECCTL_HOME", str(tmp_path / "home"))
    said = deployment._failed

    def then_asked_to_stop(*args: object, **kwargs: object) -> int:
        code = said(*args, **kwargs)  # type: ignore[arg-type]
        os.kill(os.getpid(), signal.SIGTERM)  # handled by the watch's handler: this goes on
        return code

    monkeypatch.setattr(deployment, "_failed", then_asked_to_stop)
    before = signal.getsignal(signal.SIGTERM)
    assert deployment.run_apply(cluster, True, 60.0, watch_s=30.0) == 5
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers were put back


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_accepts_it(tmp_path: Path) -> None:
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text())
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
