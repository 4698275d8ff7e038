"""watch.json: the watch keeping a home's deployment, told from a process gone (its pid
reused too) or a damaged record, and a second watch refused while the first lives."""

import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from daemon.specd.process_tree import process_start_ticks
from specctl.apply.watch_record import WatchRecord, WatchRunning, claim, clear, live_watch


def test_this_watch_is_seen_and_cleared(tmp_path: Path) -> None:
    path = tmp_path / "watch.json"
    assert live_watch(path) is None
    record = claim(path, 30.0, "/etc/cluster.toml")
    assert live_watch(path) == record
    assert re.fullmatch(
        rf"pid {os.getpid()}, every 30 s since \d\d:\d\d:\d\d; no repair so far", record.describe()
    )
    clear(path, record)
    assert not path.exists()


def test_a_gone_process_or_a_damaged_record_is_no_watch(tmp_path: Path) -> None:
    path = tmp_path / "watch.json"
    gone = WatchRecord(2, None, 1.0, "x", 0.0)
    ended = subprocess.Popen(["true"])
    ended.wait(timeout=30)
    for record in (
        dataclasses.replace(gone, pid=ended.pid, start_ticks=1),  # exited
        dataclasses.replace(WatchRecord.for_this_process(1.0, "x"), start_ticks=1),  # pid reused
    ):
        record.save(path)
        assert live_watch(path) is None
    for damaged in ("{", "[]", '{"pid": 1}', json.dumps({**dataclasses.asdict(gone), "pid": "7"})):
        path.write_text(damaged)
        assert live_watch(path) is None
    assert claim(path, 2.0, "y").pid > 1  # over a record no process holds


def test_a_second_watch_is_refused_while_the_first_lives(tmp_path: Path) -> None:
    path = tmp_path / "watch.json"
    other = subprocess.Popen(["sleep", "60"])
    try:
        ticks = process_start_ticks(other.pid)
        first = WatchRecord(other.pid, ticks, 10.0, "/a/cluster.toml", 0.0, 2, 60.0, "repaired")
        first.save(path)
        with pytest.raises(WatchRunning) as refused:
            claim(path, 5.0, "/b/cluster.toml")
        said = str(refused.value)
        running = f"a watch already keeps this home's deployment running (pid {other.pid}, "
        assert said.startswith(running + "every 10 s since ")
        assert "; 2 repairs, the last at " in said
        assert said.endswith(": repaired; /a/cluster.toml): stop it first (kill "
                             f"{other.pid}, or stop its service)")  # fmt: skip
        clear(path, WatchRecord.for_this_process(5.0, "/b"))  # not ours: left
        assert live_watch(path) == first
    finally:
        other.kill()
        other.wait(timeout=30)
    assert live_watch(path) is None
