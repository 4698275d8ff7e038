"""`specctl init` writes a 0600 cluster token and refuses to overwrite one; specd reads it."""

import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from daemon.cluster_token import TokenError, read_token
from specctl.cli import app


def _init(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["init", *args])
    return result.exit_code, result.output


def test_init_creates_a_0600_token_and_instructions(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "cluster.token"
    code, output = _init("--token-file", str(path))
    assert code == 0, output
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    token = read_token(path)
    assert len(token) == 64
    assert token not in output  # instructions, not the secret
    assert "/etc/specd/cluster.token" in output and "install -D -m 0600" in output


def test_init_refuses_to_replace_without_force(tmp_path: Path) -> None:
    path = tmp_path / "cluster.token"
    assert _init("--token-file", str(path))[0] == 0
    first = read_token(path)
    code, output = _init("--token-file", str(path))
    assert code == 2 and "--force" in output and "Traceback" not in output
    assert read_token(path) == first
    assert _init("--token-file", str(path), "--force")[0] == 0
    assert read_token(path) != first


@pytest.mark.parametrize("where", ["empty", "directory", "under a file"])
def test_init_names_a_path_that_cannot_hold_a_token(tmp_path: Path, where: str) -> None:
    """An empty path was a ValueError traceback; a directory with --force left a secret
    behind as `.NAME.tmp`; a path under a file said only "File exists"."""
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    given, expected = {
        "empty": ("", "--token-file is empty"),
        "directory": (str(tmp_path / "dir"), "a directory; the token file is a file"),
        "under a file": (str(tmp_path / "file" / "tok"), "is a file, not a directory"),
    }[where]
    code, output = _init("--token-file", given, "--force")
    assert code == 2, output
    assert output.startswith("specctl: error: ") and expected in output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "file"]
    assert list((tmp_path / "dir").iterdir()) == []


def test_two_tokens_differ(tmp_path: Path) -> None:
    _init("--token-file", str(tmp_path / "a"))
    _init("--token-file", str(tmp_path / "b"))
    assert read_token(tmp_path / "a") != read_token(tmp_path / "b")


@pytest.mark.parametrize(
    ("content", "mode", "expected"),
    [
        ("a" * 64, 0o644, "must not be readable by group or others"),
        ("not a token", 0o600, "does not hold a cluster token"),
        ("", 0o600, "does not hold a cluster token"),
    ],
)
def test_bad_token_files_are_refused(
    tmp_path: Path, content: str, mode: int, expected: str
) -> None:
    path = tmp_path / "t"
    path.write_text(content)
    path.chmod(mode)
    with pytest.raises(TokenError, match=expected) as info:
        read_token(path)
    assert str(path) in str(info.value)


def test_missing_token_file(tmp_path: Path) -> None:
    with pytest.raises(TokenError, match="not found"):
        read_token(tmp_path / "absent")
