"""Open the TUI: resolve what to open, then run the app until the user quits."""

from pathlib import Path

from tui.core.settings import resolve_settings


def run_tui(config_file: Path | None, model_dirs: tuple[Path, ...] = ()) -> None:
    from tui.app import SpecctlApp

    SpecctlApp(resolve_settings(config_file, model_dirs)).run()
