"""Pilot tests of the Nodes and Models screens on real nodes, a real specd and real model
directories: what they show, and the bad states (closed port, wrong token) shown, not raised."""

import re
from pathlib import Path

import pytest

from tests.specd.specd_process import SpecdProcess, free_port
from tests.tui.conftest import specd_cluster
from tests.tui.helpers import EXAMPLE_MODELS, LOCAL_TOML, make_app, wait_for_text, write_remote_pair
from tui.screens.assign import AssignScreen
from tui.screens.models import ModelsScreen

pytestmark = pytest.mark.anyio


async def test_local_nodes_with_cpus_and_memory(tmp_path: Path) -> None:
    app = make_app(LOCAL_TOML, tmp_path / "home")
    async with app.run_test(size=(100, 30)) as pilot:
        text = await wait_for_text(pilot, "verifier-node", "drafter-node", "all reachable")
        assert "CPU" in text and "GiB" in text


async def test_unreachable_nodes_say_why_and_what_is_declared(tmp_path: Path) -> None:
    app = make_app(write_remote_pair(tmp_path), tmp_path / "home")
    async with app.run_test(size=(120, 30)) as pilot:
        text = await wait_for_text(pilot, "2 unreachable", "spark", "rtx5090")
        assert "Connection refused" in text
        assert "declared in the cluster file: 1 x NVIDIA GB10 119 GiB unified" in text
        await pilot.press("down")  # the second node's detail
        await wait_for_text(pilot, "1 x NVIDIA GeForce RTX 5090 31.8 GiB")


async def test_a_real_specd_and_a_wrong_token(
    tmp_path: Path, specd: SpecdProcess, wrong_token_file: Path
) -> None:
    good = specd_cluster(tmp_path, f"127.0.0.1:{specd.port}", specd.token_file)
    app = make_app(good, tmp_path / "home", probe_timeout_s=5.0)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for_text(pilot, "gpu-box", "all reachable", "not running")
    (tmp_path / "wrong").mkdir()
    wrong = specd_cluster(tmp_path / "wrong", f"127.0.0.1:{specd.port}", wrong_token_file)
    app = make_app(wrong, tmp_path / "home", probe_timeout_s=5.0)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for_text(pilot, "1 unreachable", "refused the cluster token")
        await pilot.press("r")  # refreshing again is fine too
        await wait_for_text(pilot, "refused the cluster token")


async def test_closed_port_alongside_a_local_node(tmp_path: Path, specd: SpecdProcess) -> None:
    closed = f"127.0.0.1:{free_port()}"
    app = make_app(specd_cluster(tmp_path, closed, specd.token_file), tmp_path / "home")
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for_text(pilot, "1 unreachable", "unreachable (ConnectError")


async def test_models_lists_the_catalog_and_puts_a_model_in_a_role(tmp_path: Path) -> None:
    app = make_app(
        LOCAL_TOML,
        tmp_path / "home",
        model_dirs=(EXAMPLE_MODELS,),
        save_path=tmp_path / "cluster.toml",
    )
    async with app.run_test(size=(120, 36), notifications=True) as pilot:
        await pilot.press("2")
        text = await wait_for_text(pilot, "4 model(s) found, 2 in the cluster file")
        assert "llama-3.3-70b-instruct" in text and "70.6B" in text and "no weights" in text
        assert re.search(r"demo-draft\s+demo-target\s+same", text)
        assert re.search(r"llama-3.1-8b-instruct\s+llama-3.3-70b-instruct\s+vocab size only", text)
        assert isinstance(app.screen, ModelsScreen)
        await pilot.press("down", "down")  # the 8B, not yet in the file
        await wait_for_text(pilot, "examples/models/llama-3.1-8b-instruct")
        await pilot.press("d")
        await wait_for_text(pilot, "llama-3.1-8b-instruct is now the drafter")
        assert isinstance(app.screen, AssignScreen)
        assert app.session is not None
        document = app.session.document
        assert document.get(("deployment", "drafter", "model")) == "llama-3.1-8b-instruct"
        assert document.get(("models", 2, "path")) == "models/llama-3.1-8b-instruct"
        # a 128256-token drafter for a 4096-token verifier: the verdict says so
        await wait_for_text(pilot, "Invalid", "need the same tokenizer")
