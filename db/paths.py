"""Where the store lives: `$SPECCTL_HOME/specctl.db`, `~/.specctl/specctl.db` by default."""

import os
from pathlib import Path

STORE_FILE_NAME = "specctl.db"
DEFAULT_HOME = "~/.specctl"


def specctl_home(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("SPECCTL_HOME") or DEFAULT_HOME).expanduser()


def default_store_path(environ: dict[str, str] | None = None) -> Path:
    return specctl_home(environ) / STORE_FILE_NAME
