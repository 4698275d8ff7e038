"""Import rules: node code never imports the control plane; the control plane's config, planner
and store never import torch or textual (the TUI calls them and must start fast)."""

import subprocess
import sys

import pytest


def _modules_after_import(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return set(result.stdout.split())


def test_specd_never_imports_the_control_plane() -> None:
    loaded = _modules_after_import("daemon.specd.cli")
    assert "daemon.cluster_token" in loaded
    assert not {name for name in loaded if name == "specctl" or name.startswith("specctl.")}


HEAVY = ("torch", "textual", "ray", "transformers")


@pytest.mark.parametrize(
    "module", ["specctl.config", "specctl.planner", "specctl.commands.plan", "db"]
)
def test_control_plane_core_stays_light(module: str) -> None:
    loaded = _modules_after_import(module)
    assert not {name for name in loaded if name.split(".")[0] in HEAVY}
