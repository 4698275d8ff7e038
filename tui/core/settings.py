"""What the TUI is opened on and how often it looks again: resolved once at start-up."""

import os
from dataclasses import dataclass
from pathlib import Path

from specctl.apply.watch_record import DEFAULT_TUI_INTERVAL_S
from specctl.home import SpecctlHome

CLUSTER_FILE_NAME = "cluster.toml"
MODEL_PATH_ENV = "SPECCTL_MODEL_PATH"  # extra model search directories, ':'-separated
EMBEDDED_DEFAULT = Path(__file__).resolve().parents[2] / "examples" / "local.toml"


@dataclass(frozen=True, slots=True)
class TuiSettings:
    config_path: Path
    """The cluster file opened at start-up."""

    save_path: Path
    """Where Save writes it: the file itself, or ./cluster.toml when the file opened is the
    embedded default (examples/local.toml stays as shipped)."""

    home: SpecctlHome
    """$SPECCTL_HOME: the store the Dashboard reads, server.log, the deployment's state."""

    model_dirs: tuple[Path, ...] = ()
    """Extra directories the Models screen searches (--models-dir, $SPECCTL_MODEL_PATH)."""

    nodes_refresh_s: float = 5.0
    """Seconds between two readings of every node (inventory, GPUs, Ray state)."""

    dashboard_refresh_s: float = 1.0
    """Seconds between two readings of the store (the serving process writes once a second)."""

    logs_refresh_s: float = 1.0
    """Seconds between two looks at server.log and the nodes' specd logs."""

    probe_timeout_s: float = 2.0
    """How long to wait for a node's specd before calling it unreachable."""

    dashboard_window_minutes: float = 5.0
    """How far back the Dashboard's sparklines reach."""

    watch_interval_s: float = DEFAULT_TUI_INTERVAL_S
    """How often a watch started from Launch looks at the deployment (--watch-interval)."""

    @property
    def is_embedded_default(self) -> bool:
        return self.config_path == EMBEDDED_DEFAULT


def model_dirs_from_env(environ: dict[str, str] | None = None) -> tuple[Path, ...]:
    raw = (os.environ if environ is None else environ).get(MODEL_PATH_ENV, "")
    return tuple(Path(part).expanduser() for part in raw.split(":") if part.strip())


def resolve_settings(
    config_file: Path | None,
    model_dirs: tuple[Path, ...] = (),
    cwd: Path | None = None,
    home: SpecctlHome | None = None,
    watch_interval_s: float = DEFAULT_TUI_INTERVAL_S,
) -> TuiSettings:
    """`specctl FILE` opens FILE; plain `specctl` opens ./cluster.toml if there is one, else
    the embedded default (Save then writes ./cluster.toml)."""
    here = (cwd or Path.cwd()).resolve()
    local_file = here / CLUSTER_FILE_NAME
    if config_file is not None:
        path = (here / config_file.expanduser()).resolve()
    else:
        path = local_file if local_file.is_file() else EMBEDDED_DEFAULT
    save_path = local_file if path == EMBEDDED_DEFAULT else path
    return TuiSettings(
        config_path=path,
        save_path=save_path,
        home=home or SpecctlHome.resolve(),
        model_dirs=(*model_dirs, *model_dirs_from_env()),
        watch_interval_s=watch_interval_s,
    )
