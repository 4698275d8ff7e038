from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.cluster_token import generate_token, write_token

from .specd_process import SpecdProcess


@pytest.fixture(scope="module")
def cluster_token(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("token") / "cluster.token"
    token = generate_token()
    write_token(path, token, force=False)
    return path, token


@pytest.fixture(scope="module")
def specd_pair(cluster_token: tuple[Path, str]) -> Iterator[tuple[SpecdProcess, SpecdProcess]]:
    """Two specd daemons on this machine, separate ports, state and Ray temp dirs."""
    token_file, token = cluster_token
    head = SpecdProcess(token_file, token, "node-a")
    try:
        worker = SpecdProcess(token_file, token, "node-b")
    except BaseException:
        head.close()
        raise
    try:
        yield head, worker
    finally:
        worker.close()
        head.close()


@pytest.fixture(scope="module")
def specd_single(cluster_token: tuple[Path, str]) -> Iterator[SpecdProcess]:
    token_file, token = cluster_token
    daemon = SpecdProcess(token_file, token, "solo")
    try:
        yield daemon
    finally:
        daemon.close()
