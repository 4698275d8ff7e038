"""A real multi-node Ray cluster on this machine for tests: token auth on, each node with its
own temp dir, ports and labels; the test process joins it as a driver. `close()` leaves no
Ray process and no Ray environment variable behind."""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from daemon.cluster_token import generate_token, write_token
from daemon.specd.process_tree import process_argv
from specctl.cluster.local_cluster import LocalCluster
from specctl.cluster.local_nodes import LocalNodeSpec
from specctl.deploy.ray_connect import connect, disconnect

_DRIVER_ENV = (
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN_PATH",
    "RAY_AUTH_TOKEN",
    "RAY_NUM_REDIS_GET_RETRIES",
)


class TestCluster:
    __test__ = False  # a fixture helper, not a test class

    def __init__(self, specs: list[LocalNodeSpec]) -> None:
        # short path: Ray's unix socket paths must stay below 107 bytes
        self.root = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))
        self.token_file = self.root / "token"
        write_token(self.token_file, generate_token(), force=False)
        self._saved_env = {k: os.environ.get(k) for k in _DRIVER_ENV}
        self.cluster = LocalCluster(specs, self.root / "n", self.token_file)
        try:
            self.address = self.cluster.start()
            connect(self.address, self.token_file)
        except BaseException:
            self.close()
            raise

    def node(self, name: str):
        return next(n for n in self.cluster.nodes if n.spec.name == name)

    def close(self) -> list[int]:
        with contextlib.suppress(Exception):
            disconnect()
        leftover = self.cluster.stop()
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(self.root, ignore_errors=True)
        return leftover


def raylet_pids(root: Path) -> list[int]:
    """The raylets among ray_processes_under(root)."""
    return [
        pid
        for pid in ray_processes_under(root)
        if Path((process_argv(pid) or [""])[0]).name == "raylet"
    ]


def ray_processes_under(root: Path) -> list[int]:
    """Live processes whose command line names `root` (a test cluster's Ray processes)."""
    marker = str(root).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
    return pids
