"""Where specctl keeps its state: `$SPECCTL_HOME`, by default `~/.specctl`.

    cluster.token        the cluster token (0600), made on first apply when none is named
    state.json           the deployment applied last (config, plan, what runs where)
    specctl.db           metrics history and request records (SQLite, WAL)
    server.json / .log   the serving process: pid, endpoint, its log
    watch.json           the `apply --watch` keeping the deployment running, while one runs

Local Ray nodes keep their state under a short directory in /tmp (`ray_root`): Ray's unix
socket paths must stay below 107 bytes, which a home directory path can exceed.
"""

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "SPECCTL_HOME"


@dataclass(frozen=True, slots=True)
class SpecctlHome:
    root: Path

    @staticmethod
    def resolve(explicit: Path | None = None) -> "SpecctlHome":
        raw = explicit or Path(os.environ.get(HOME_ENV) or "~/.specctl")
        return SpecctlHome(raw.expanduser().resolve())

    def ensure(self) -> "SpecctlHome":
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self

    @property
    def token_file(self) -> Path:
        return self.root / "cluster.token"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def db_file(self) -> Path:
        return self.root / "specctl.db"

    @property
    def server_file(self) -> Path:
        return self.root / "server.json"

    @property
    def watch_file(self) -> Path:
        return self.root / "watch.json"

    @property
    def server_log(self) -> Path:
        return self.root / "server.log"

    @property
    def ray_root(self) -> Path:
        """A short directory under /tmp for local Ray nodes, one per home (hashed path)."""
        digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:10]
        return Path("/tmp") / f"specctl-{os.getuid()}-{digest}"
