"""One apply or down at a time per home: a second one is refused at once, naming the first;
the lock goes with its holder, however that ends."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from specctl.apply.home_lock import LOCK_FILE_NAME, HomeBusyError, home_lock
from specctl.home import SpecctlHome

from .deployment_cli import Cli, free_port, local_cluster_file


def test_a_second_apply_or_down_is_refused_while_one_runs(tmp_path: Path) -> None:
    home = SpecctlHome(tmp_path / "home").ensure()
    config = local_cluster_file(tmp_path / "cluster.toml", free_port())
    cli = Cli(home.root)
    with home_lock(home, "apply"):
        for argv in (("apply", str(config)), ("down",)):
            done = cli.run(*argv)
            assert done.returncode == 1, done.stdout + done.stderr
            said = " ".join(done.stderr.split())
            assert f"another specctl is changing the deployment under {home.root}" in said
            assert f"(apply, pid {os.getpid()})" in said, said
            assert "Traceback" not in done.stderr
        assert cli.processes() == []  # nothing was started
        try:  # in one process too (the TUI's apply and down run on threads of one)
            with home_lock(home, "down"):
                raise AssertionError("the lock was taken twice")
        except HomeBusyError:
            pass
    assert (home.root / LOCK_FILE_NAME).read_text() == ""  # let go, holder no more named
    done = cli.run("down")  # free again: nothing applied, nothing to stop
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_lock_goes_with_a_killed_holder(tmp_path: Path) -> None:
    home = SpecctlHome(tmp_path / "home").ensure()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from pathlib import Path
                from specctl.apply.home_lock import home_lock
                from specctl.home import SpecctlHome
                with home_lock(SpecctlHome(Path({str(home.root)!r})), "apply"):
                    print("held", flush=True)
                    time.sleep(60)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        try:
            with home_lock(home, "down"):
                raise AssertionError("taken while another process held it")
        except HomeBusyError as exc:
            assert f"pid {holder.pid}" in str(exc)
    finally:
        holder.kill()
        holder.wait(timeout=10)
    with home_lock(home, "down"):  # the kernel let it go with the process
        pass


def test_a_home_not_made_yet_is_not_made_for_the_lock(tmp_path: Path) -> None:
    home = SpecctlHome(tmp_path / "nowhere")
    with home_lock(home, "down"):
        pass
    assert not home.root.exists()
