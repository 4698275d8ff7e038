"""Fixtures of the TUI tests: a real specd on loopback (its token, and a wrong one)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.cluster_token import generate_token, write_token
from tests.specd.specd_process import SpecdProcess


@pytest.fixture
def anyio_backend() -> str:
    """Pilot tests are async; anyio's pytest plugin runs them on asyncio (Textual's loop)."""
    return "asyncio"


@pytest.fixture(scope="module")
def specd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpecdProcess]:
    """A real specd daemon (no Ray started) with the token in `specd.token_file`."""
    directory = tmp_path_factory.mktemp("specd-token")
    token_file, token = directory / "cluster.token", generate_token()
    write_token(token_file, token, force=False)
    daemon = SpecdProcess(token_file, token, "gpu-box")
    daemon.token_file = token_file  # type: ignore[attr-defined]
    try:
        yield daemon
    finally:
        daemon.close()


@pytest.fixture(scope="module")
def wrong_token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("wrong-token") / "cluster.token"
    write_token(path, generate_token(), force=False)
    return path


def specd_cluster(directory: Path, specd_address: str, token_file: Path) -> Path:
    """A cluster file whose one specd node is at `specd_address`; the demo pair planned on
    this machine through a local node."""
    demo = Path(__file__).resolve().parents[2] / "packaging" / "demo-models"
    path = directory / "cluster.toml"
    path.write_text(
        f"""\
# one remote node, one local
[[nodes]]
name = "gpu-box"
specd = "{specd_address}"
token_file = "{token_file}"

[[nodes]]
name = "here"
specd = "local"

[[models]]
name = "target"
path = "{demo / "target"}"

[[models]]
name = "draft"
path = "{demo / "draft"}"

[deployment.verifier]
model = "target"
nodes = ["here"]

[deployment.drafter]
model = "draft"
node = "gpu-box"
"""
    )
    return path
