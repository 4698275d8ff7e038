"""The daemon's log: a file in the state directory, and its last lines for GET /v1/logs."""

import logging
from collections import deque
from pathlib import Path

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(log_file: Path) -> None:
    """Log to stderr (the journal under systemd) and to `log_file`."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    formatter = logging.Formatter(LOG_FORMAT)
    for handler in (logging.StreamHandler(), logging.FileHandler(log_file)):
        handler.setFormatter(formatter)
        root.addHandler(handler)


def tail_lines(path: Path, num_lines: int) -> list[str]:
    """The last `num_lines` lines of `path` (fewer if it is shorter; none if it is missing)."""
    try:
        with path.open(errors="replace") as file:
            return [line.rstrip("\n") for line in deque(file, maxlen=num_lines)]
    except FileNotFoundError:
        return []
