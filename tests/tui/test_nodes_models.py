"""Pilot tests of the Nodes and Models screens on real nodes, a real specd and real model
directories: what they show, and the bad states (closed port, wrong token) shown, not raised."""

import re
from pathlib import Path

import pytest

from daemon.cluster_token import generate_token, write_token
from tests.specd.specd_process import DEMO_MODELS, SpecdProcess, free_port, nodes_only_prefix
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


async def test_the_nodes_are_shown_where_a_model_is_missing(tmp_path: Path) -> None:
    """A model path that is wrong (or a model kept on nodes that are down) made the whole file
    invalid, and the Nodes screen showed only "the cluster file has errors": it needs the
    nodes alone. The Models screen still says what is wrong with the model."""
    text = LOCAL_TOML.read_text()
    wrong = tmp_path / "no-such-model"
    changed = re.sub(r'path = "[^"]*target"', f'path = "{wrong}"', text, count=1)
    assert changed != text
    config = tmp_path / "cluster.toml"
    config.write_text(changed)
    app = make_app(config, tmp_path / "home")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for_text(pilot, "verifier-node", "drafter-node", "all reachable")
        await pilot.press("2")
        shown = await wait_for_text(pilot, "2 model(s) found", wrong.name)
        assert re.search(r"demo-target\s+model d", shown), shown  # "model directory ... does not"


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


async def test_a_model_kept_on_its_node_alone_is_read_through_its_specd(tmp_path: Path) -> None:
    """The operator's machine has no copy of the target: it is on gpu-box alone (a specd in
    a mount namespace of its own, where the demo target is at a path empty out here). The
    Models screen listed it as missing; it now shows it as gpu-box's specd describes it, and
    pairs it with the draft here."""
    models_root = tmp_path / "on-gpu-box"
    models_root.mkdir()
    prefix = nodes_only_prefix(models_root)
    if prefix is None:
        pytest.skip("no mount namespace here (not root): a node shares this machine's paths")
    token_file = tmp_path / "cluster.token"
    write_token(token_file, generate_token(), force=False)
    daemon = SpecdProcess(token_file, token_file.read_text().strip(), "gpu-box", prefix=prefix)
    try:
        config = specd_cluster(tmp_path, f"127.0.0.1:{daemon.port}", token_file)
        text = config.read_text().replace(
            f'path = "{DEMO_MODELS / "target"}"', f'path = "{models_root / "target"}"'
        )
        config.write_text(text.replace('nodes = ["here"]', 'nodes = ["gpu-box"]'))
        assert not (models_root / "target").exists()
        app = make_app(config, tmp_path / "home", probe_timeout_s=5.0)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("2")
            # the demo target beside the draft here is a third, outside the file
            shown = await wait_for_text(pilot, "3 model(s) found, 2 in the cluster file")
            assert re.search(r"target\s+Llama\s+\S+\s+on gpu-box\s+4,096\s+6\s+yes", shown), shown
            assert re.search(r"draft\s+target\s+vocab size only", shown), shown
            # the first row, the target, highlighted: where it was read
            await wait_for_text(pilot, "on gpu-box (read through its specd")
        # the draft too kept on a node of its own, which is down: the file fails its check
        # (the draft cannot be read), and the target is still read on gpu-box
        down = f'[[nodes]]\nname = "draft-box"\nspecd = "127.0.0.1:{free_port()}"\n'
        down += f'token_file = "{token_file}"\n\n[[models]]'
        text = config.read_text().replace("[[models]]", down, 1)
        text = text.replace(f'path = "{DEMO_MODELS / "draft"}"', f'path = "{models_root}/gone"')
        config.write_text(text.replace('node = "gpu-box"', 'node = "draft-box"'))
        app = make_app(config, tmp_path / "home", probe_timeout_s=5.0)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("2")
            shown = await wait_for_text(pilot, "model(s) found, 2 in the cluster file")
            assert re.search(r"target\s+Llama\s+\S+\s+on gpu-box\s+4,096\s+6\s+yes", shown), shown
            assert re.search(r"draft\s+model d", shown), shown  # "model directory ... nor on"
    finally:
        daemon.close()
