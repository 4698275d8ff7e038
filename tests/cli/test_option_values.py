"""Numeric options that compare as valid but are not: NaN and infinity pass `x <= 0`, and a
port out of range reached bind() (tracebacks, or a wait that never ends). The cluster files
named do not exist: were a check to go, the command fails on the file, starting nothing."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TARGET = REPO_ROOT / "packaging" / "demo-models" / "target"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["serve", "--target", str(TARGET), "--port", "-1"],
            "--port must be in 0..65535 (0: any free port), got -1",
        ),
        (["serve", "--target", str(TARGET), "--port", "70000"], "--port must be in 0..65535"),
        (["serve", "--target", str(TARGET), "--max-model-len", "0"], "--max-model-len must be"),
        (["serve", "--target", str(TARGET), "--served-model-name", " "], "--served-model-name is"),
        (
            ["serve", "--target", str(TARGET), "--prefill-chunk-tokens", "0"],
            "--prefill-chunk-tokens must be >= 1, got 0",
        ),
        (
            ["serve", "--deployment", "/nonexistent/state.json", "--prefill-chunk-tokens", "64"],
            "--prefill-chunk-tokens: the deployment's shards run as its cluster file says",
        ),
        (
            ["serve", "--deployment", "/nonexistent/state.json", "-k", "3", "--adaptive"],
            "--num-speculative-tokens, --adaptive: the deployment's shards run as",
        ),
        (
            ["serve", "--target", str(TARGET), "--graceful-timeout-s", "nan"],
            "--graceful-timeout-s must be a finite number >= 0, got nan",
        ),
        (
            ["serve", "--target", str(TARGET), "--graceful-timeout-s", "inf"],
            "--graceful-timeout-s must",
        ),
        (
            ["plan", "/nonexistent/cluster.toml", "--timeout", "nan"],
            "--timeout must be a finite number > 0 (seconds), got nan",
        ),
        (["apply", "/nonexistent/cluster.toml", "--load-timeout", "inf"], "--load-timeout must be"),
    ],
)
def test_a_number_that_is_no_setting_is_a_usage_error(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "specctl.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env={"SPECCTL_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"specctl: error: {needle}" in done.stderr
    assert "Traceback" not in done.stderr
