"""The TUI is a client of the control plane: running it through every screen imports no
torch, ray or transformers; its headless core imports no textual either."""

import subprocess
import sys
import tempfile

from tests.tui.helpers import LOCAL_TOML, REPO

HEAVY = ("torch", "ray", "transformers")

VISIT_EVERY_SCREEN = """
import asyncio, sys
from pathlib import Path
from tests.tui.helpers import make_app, wait_for_text

async def visit() -> None:
    app = make_app(Path(sys.argv[1]), Path(sys.argv[2]))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_text(pilot, "all reachable")
        for key, needle in (("2", "model(s) found"), ("3", "Fits"), ("4", "nothing deployed"),
                            ("5", "store missing"), ("6", "no log yet")):
            await pilot.press(key)
            await wait_for_text(pilot, needle)

asyncio.run(visit())
print(" ".join(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_the_app_through_every_screen_imports_no_torch_ray_or_transformers() -> None:
    # a short home: the Logs screen's "<home>/server.log: no log yet" stays on one line
    # (beside the list of logs, a wrap would put the list's border inside the words)
    with tempfile.TemporaryDirectory(prefix="tui-", dir="/tmp") as home:
        result = subprocess.run(
            [sys.executable, "-c", VISIT_EVERY_SCREEN, str(LOCAL_TOML), home],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=REPO,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = set(result.stdout.split())
    assert {"textual", "tui", "specctl", "db"} <= loaded  # it did run, and read the store
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_the_headless_core_imports_no_textual() -> None:
    modules = ["tui.core." + p.stem for p in (REPO / "tui" / "core").glob("*.py")]
    modules.remove("tui.core.launch_child")  # the child process: it runs apply (ray, torch)
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules)
    code += "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = set(result.stdout.split())
    assert not loaded & {"textual", *HEAVY}, loaded & {"textual", *HEAVY}
