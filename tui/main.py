"""Open the TUI: resolve what to open, then run the app until the user quits."""

from pathlib import Path

from specctl.apply.watch_record import DEFAULT_TUI_INTERVAL_S
from tui.core.settings import resolve_settings


def run_tui(
    config_file: Path | None,
    model_dirs: tuple[Path, ...] = (),
    watch_interval_s: float = DEFAULT_TUI_INTERVAL_S,
) -> None:
    from tui.app import SpecctlApp

    settings = resolve_settings(config_file, model_dirs, watch_interval_s=watch_interval_s)
    SpecctlApp(settings).run()
