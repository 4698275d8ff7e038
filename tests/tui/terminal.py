"""A real terminal for end-to-end tests: a tmux session of its own (own socket) running one
command, whose screen is read with capture-pane and driven with send-keys."""

import shlex
import subprocess
import time
import uuid
from pathlib import Path


def shows(text: str, needle: str) -> bool:
    """Whether a screen's text shows `needle`, wherever the terminal wrapped it: a message
    naming a path wraps at another word when the path is longer (a parallel run's temp dirs)."""
    return needle in text or " ".join(needle.split()) in " ".join(text.split())


class TmuxTerminal:
    def __init__(
        self, command: list[str], cwd: Path, env: dict[str, str], size: tuple[int, int] = (120, 40)
    ) -> None:
        self.socket = f"specctl-test-{uuid.uuid4().hex[:8]}"
        self.session = "tui"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        shell = f"cd {shlex.quote(str(cwd))} && env {exports} {shlex.join(command)}"
        width, height = size
        self._tmux(
            "new-session", "-d", "-s", self.session, "-x", str(width), "-y", str(height), shell
        )

    def _tmux(self, *args: str) -> str:
        result = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30
        )
        if result.returncode != 0:
            raise RuntimeError(f"tmux {args[0]} failed: {result.stderr.strip()}")
        return result.stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", self.session)

    def press(self, *keys: str) -> None:
        for key in keys:
            self._tmux("send-keys", "-t", self.session, key)
            time.sleep(0.1)

    def wait_for(self, *needles: str, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.screen()
            if all(shows(text, needle) for needle in needles):
                return text
            if time.monotonic() > deadline:
                missing = [n for n in needles if not shows(text, n)]
                raise AssertionError(f"never on screen: {missing}\n--- screen ---\n{text}")
            time.sleep(0.2)

    def is_running(self) -> bool:
        result = subprocess.run(
            ["tmux", "-L", self.socket, "has-session", "-t", self.session],
            capture_output=True,
            timeout=30,
        )
        return result.returncode == 0

    def close(self) -> None:
        if self.is_running():
            subprocess.run(["tmux", "-L", self.socket, "kill-server"], timeout=30)
