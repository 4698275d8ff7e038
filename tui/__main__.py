"""`python -m tui [FILE]`: the same as `specctl [FILE]`."""

import sys
from pathlib import Path

from tui.main import run_tui

if __name__ == "__main__":
    run_tui(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
