"""Pilot tests of the Assign screen: editing through the form (keys and mouse) writes the
cluster document, the verdict follows live, Save keeps the user's comments, Open loads another
file, and a file that is not TOML is shown, not crashed on."""

from pathlib import Path

import pytest
from textual.widgets import Input, Select, SelectionList

from specctl.config import load_config
from tests.tui.helpers import LOCAL_TOML, make_app, wait_for_text, wait_until, write_remote_pair
from tui.app import SpecctlApp
from tui.widgets.verdict import VerdictPanel

pytestmark = pytest.mark.anyio


@pytest.fixture
def cluster_file(tmp_path: Path) -> Path:
    """A copy of examples/local.toml with its model paths made absolute."""
    text = LOCAL_TOML.read_text().replace('"../packaging', f'"{LOCAL_TOML.parents[1]}/packaging')
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return path


def document_value(app: SpecctlApp, *loc: str) -> object:
    assert app.session is not None
    return app.session.document.get(loc)


async def retype(pilot, widget_id: str, text: str) -> None:  # type: ignore[no-untyped-def]
    field = pilot.app.screen.query_one(f"#{widget_id}", Input)
    field.focus()
    await pilot.press("end", *["backspace"] * len(field.value), *text)


async def test_typing_edits_the_file_and_the_verdict_follows(cluster_file: Path) -> None:
    app = make_app(cluster_file, cluster_file.parent / "home")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        await wait_for_text(pilot, "● Fits", "verifier demo-target: all 6 layers on verifier-node")
        assert pilot.app.screen.query_one("#verifier-nodes", SelectionList).selected == [
            "verifier-node"
        ]
        await retype(pilot, "k", "7")
        await wait_for_text(pilot, "k = 7 drafted tokens per round")
        assert document_value(app, "deployment", "speculation", "k") == 7
        await retype(pilot, "split", "3, 3")
        await wait_for_text(pilot, "● Invalid", "deployment.verifier.pipeline_split")
        await retype(pilot, "split", "auto")
        await wait_for_text(pilot, "● Fits")
        await retype(pilot, "replicas", "x")
        await wait_for_text(pilot, "replicas: a whole number")
        assert document_value(app, "deployment", "replicas") is None  # nothing written
        await retype(pilot, "replicas", "2")
        await wait_for_text(pilot, "● Fits")
        assert app.session is not None and app.session.is_dirty


async def test_choosing_ngram_and_adaptive_with_keys_and_mouse(cluster_file: Path) -> None:
    app = make_app(cluster_file, cluster_file.parent / "home")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        await wait_for_text(pilot, "● Fits")
        drafter = pilot.app.screen.query_one("#drafter-model", Select)
        drafter.focus()
        await pilot.press("enter", "down", "enter")  # from demo-draft to ngram, the next
        await wait_for_text(pilot, "speculation: n-gram")
        assert document_value(app, "deployment", "drafter") == {"model": "ngram"}
        assert pilot.app.screen.query_one("#drafter-node", Select).disabled
        await pilot.click("#adaptive")
        await wait_until(
            pilot, lambda: document_value(app, "deployment", "speculation", "adaptive"), "adaptive"
        )
        await wait_for_text(pilot, "max k")
        await retype(pilot, "k", "6")
        await wait_until(
            pilot, lambda: document_value(app, "deployment", "speculation", "max_k") == 6, "max_k 6"
        )


async def test_a_placement_that_does_not_fit_says_why(tmp_path: Path) -> None:
    app = make_app(write_remote_pair(tmp_path), tmp_path / "home")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        await wait_for_text(pilot, "● Fits")
        nodes = pilot.app.screen.query_one("#verifier-nodes", SelectionList)
        nodes.focus()
        await pilot.press("home", "space")  # spark off: no node left, refused
        await wait_for_text(pilot, "verifier nodes: pick at least")
        await wait_until(pilot, lambda: nodes.selected == ["spark"], "spark selected again")
        await pilot.press("down", "space")  # the 70B pipelined over both: the 5090 stage is short
        await wait_until(
            pilot,
            lambda: document_value(app, "deployment", "verifier", "nodes") == ["spark", "rtx5090"],
            "verifier on both",
        )
        await wait_for_text(pilot, "● Does not fit", "does not fit on rtx5090")
        await pilot.press("up", "space")  # the 70B on the 5090 alone
        await wait_until(
            pilot,
            lambda: document_value(app, "deployment", "verifier", "nodes") == ["rtx5090"],
            "verifier on rtx5090",
        )
        text = await wait_for_text(pilot, "● Does not fit")
        assert "llama-70b" in text


async def test_save_keeps_comments_and_open_loads_another_file(cluster_file: Path) -> None:
    other = write_remote_pair(cluster_file.parent / "other")
    app = make_app(cluster_file, cluster_file.parent / "home")
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await pilot.press("3")
        await wait_for_text(pilot, "● Fits")
        await retype(pilot, "port", "8123")
        await wait_for_text(pilot, "(modified, not saved)")
        await pilot.press("ctrl+s")
        await wait_for_text(pilot, "Saved")
        saved = cluster_file.read_text()
        assert "port = 8123" in saved
        assert "# 5.5M parameters, trained by packaging/demo_models/train.py" in saved
        assert "# a Ray node on this machine, no specd needed" in saved
        assert load_config(cluster_file).server.port == 8123
        await wait_until(
            pilot, lambda: app.session is not None and not app.session.is_dirty, "saved"
        )
        await pilot.press("ctrl+o")
        path_input = pilot.app.screen.query_one("#open-path", Input)
        path_input.value = str(other.parent / "missing.toml")
        await pilot.press("enter")
        await wait_for_text(pilot, "missing.toml: no such file")
        path_input.value = str(other)
        await pilot.press("enter")
        await wait_for_text(pilot, "llama-70b", "● Fits")
        assert app.session is not None and app.session.path == other


async def test_a_file_that_is_not_toml_is_shown_not_crashed_on(tmp_path: Path) -> None:
    broken = tmp_path / "cluster.toml"
    broken.write_text("[[nodes]\nname = 'x'\n")
    app = make_app(broken, tmp_path / "home")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for_text(pilot, "invalid TOML")  # on the Nodes screen
        await pilot.press("3")
        await wait_for_text(pilot, "invalid TOML")
        assert isinstance(pilot.app.screen.query_one(VerdictPanel), VerdictPanel)
        await pilot.press("ctrl+s")  # nothing to save: said, not raised
        await pilot.press("2", "5", "6", "1")


async def test_a_late_call_for_an_older_revision_leaves_the_typed_field_alone(
    cluster_file: Path,
) -> None:
    """The form's watcher of the session revision runs after the edits that queued it: while
    a port is typed digit by digit, the call for an earlier digit's revision must not write
    the document's value back into the field (seen in a real terminal: 38819 became 88819)."""
    from tui.screens.assign import AssignScreen

    app = make_app(cluster_file, cluster_file.parent / "home")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        await wait_for_text(pilot, "● Fits")
        screen = app.screen
        assert isinstance(screen, AssignScreen)
        await retype(pilot, "port", "38")
        await wait_until(pilot, lambda: document_value(app, "server", "port") == 38, "port 38")
        before_last_digit = app.session_revision - 1
        await pilot.press("backspace", "backspace")  # the field empty: no edit, an error shown
        assert screen.query_one("#port", Input).value == ""
        screen.session_changed(before_last_digit)  # the late call
        assert screen.query_one("#port", Input).value == ""
        await pilot.press(*"38819")
        await wait_until(
            pilot, lambda: document_value(app, "server", "port") == 38819, "port 38819"
        )
        assert screen.query_one("#port", Input).value == "38819"
