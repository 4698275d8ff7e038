"""specd.toml loading: flags override the file, and bad input names the file or flag and field.
The CLI turns every such error into a message and exit code 2, never a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

from daemon.cluster_token import generate_token, write_token
from daemon.specd.config import ConfigError, load_config

NO_FLAGS = {"host": None, "port": None, "token_file": None}


def test_defaults_bind_loopback() -> None:
    config = load_config(None, NO_FLAGS)
    assert config.host == "127.0.0.1" and config.port == 7601


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "specd.toml"
    path.write_text('host = "10.0.0.5"\nport = 8000\n[ray]\nport = 7000\n')
    config = load_config(path, {**NO_FLAGS, "port": 9000})
    assert (config.host, config.port, config.ray.port) == ("10.0.0.5", 9000, 7000)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("port = 70000\n", "field 'port'"),
        ("[ray]\nport = 0\n", "field 'ray.port'"),
        ("[ray]\nstart_timeout_s = 'soon'\n", "field 'ray.start_timeout_s'"),
        ("colour = 'red'\n", "field 'colour'"),
        ("port = \n", "invalid TOML"),
        ("[ray]\nport = 12000\n", "field 'ray.port': 12000 is one of the ports"),
        ("[ray]\nclient_server_port = 52365\n", "dashboard_agent_listen_port and client_serv"),
        ("port = 6379\n", "port and ray.port are both 6379"),
        ("port = 15000\n", "field 'port': 15000 is one of the ports Ray gives its workers"),
    ],
)
def test_bad_files_name_file_and_field(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "specd.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, NO_FLAGS)
    assert str(path) in str(info.value) and expected in str(info.value)


def test_bad_flag_is_named_as_a_flag() -> None:
    with pytest.raises(ConfigError, match="--port"):
        load_config(None, {**NO_FLAGS, "port": 0})


def _specd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "daemon.specd.cli", "run", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_cli_reports_bad_config_without_traceback(tmp_path: Path) -> None:
    path = tmp_path / "specd.toml"
    path.write_text("[ray]\nport = -1\n")
    result = _specd("--config", str(path))
    assert result.returncode == 2
    assert "ray.port" in result.stderr and "Traceback" not in result.stderr


def test_cli_reports_missing_token_without_traceback(tmp_path: Path) -> None:
    result = _specd("--token-file", str(tmp_path / "absent"), "--port", "1")
    assert result.returncode == 2
    assert "token file not found" in result.stderr and "Traceback" not in result.stderr


def test_cli_reports_unwritable_state_dir(tmp_path: Path) -> None:
    token = tmp_path / "t"
    write_token(token, generate_token(), force=False)
    blocker = tmp_path / "file"
    blocker.write_text("")
    path = tmp_path / "specd.toml"
    path.write_text(f'state_dir = "{blocker}/sub"\n')
    result = _specd("--config", str(path), "--token-file", str(token))
    assert result.returncode == 2
    assert "state_dir" in result.stderr and "Traceback" not in result.stderr
