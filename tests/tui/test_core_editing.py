"""The Assign screen's headless core: field edits on the real document keep comments and
order, the session saves (the embedded default to ./cluster.toml with paths rebased), and the
verdict judges the edited text as `specctl plan` would."""

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specctl.config import load_config
from specctl.config.errors import ConfigError
from tests.tui.helpers import LOCAL_TOML, write_remote_pair
from tui.core import assignment as a
from tui.core.session import ConfigSession, rebase_relative_paths
from tui.core.verdict import FactsCache, judge


@pytest.fixture
def local_copy(tmp_path: Path) -> Path:
    """examples/local.toml next to a copy of the demo models' parent layout."""
    target = tmp_path / "examples" / "local.toml"
    target.parent.mkdir()
    shutil.copy(LOCAL_TOML, target)
    (tmp_path / "packaging").symlink_to(LOCAL_TOML.parents[1] / "packaging")
    return target


def test_reading_the_example_gives_its_values_and_defaults() -> None:
    form = a.read_assignment(ConfigSession.open(LOCAL_TOML).document)
    assert form.model_names == ("demo-target", "demo-draft")
    assert form.verifier_nodes == ("verifier-node",)
    assert (form.drafter_model, form.drafter_node) == ("demo-draft", "drafter-node")
    assert (form.k, form.is_adaptive, form.mode) == ("4", False, "overlapped")
    assert (form.tensor_parallel_size, form.pipeline_split, form.replicas) == ("1", "auto", "1")


def test_edits_change_only_their_lines_and_keep_comments(local_copy: Path) -> None:
    session = ConfigSession.open(local_copy)
    before = local_copy.read_text().splitlines()
    session.edit(lambda d: a.set_k(d, "6"))
    session.edit(lambda d: a.set_drafter_node(d, "verifier-node"))
    session.edit(lambda d: a.set_tensor_parallel_size(d, "1"))  # the default, absent: no line
    session.save()
    after = local_copy.read_text().splitlines()
    changed = [(x, y) for x, y in zip(before, after, strict=True) if x != y]
    assert changed == [('node = "drafter-node"', 'node = "verifier-node"'), ("k = 4", "k = 6")]
    config = load_config(local_copy)
    assert config.deployment.speculation.k == 6
    assert config.deployment.drafter.node == "verifier-node"


def test_adaptive_moves_k_to_the_ceiling_and_back(local_copy: Path) -> None:
    session = ConfigSession.open(local_copy)
    session.edit(lambda d: a.set_adaptive(d, True))
    speculation = session.document.get(a.SPECULATION)
    assert speculation["adaptive"] is True and speculation["max_k"] == 4 and "k" not in speculation
    session.edit(lambda d: a.set_max_k(d, "7"))
    session.edit(lambda d: a.set_adaptive(d, False))
    speculation = session.document.get(a.SPECULATION)
    assert speculation == {"k": 7, "mode": "overlapped"}
    assert session.snapshot().check().is_valid


def test_ngram_drops_the_drafter_node_and_a_model_gets_one_back(local_copy: Path) -> None:
    session = ConfigSession.open(local_copy)
    session.edit(lambda d: a.set_drafter_model(d, "ngram"))
    assert session.document.get(a.DRAFTER) == {"model": "ngram"}
    with pytest.raises(a.FieldInputError, match="n-gram drafter runs inside the verifier"):
        session.edit(lambda d: a.set_drafter_node(d, "drafter-node"))
    session.edit(lambda d: a.set_drafter_model(d, "demo-draft"))
    assert session.document.get((*a.DRAFTER, "node")) == "drafter-node"  # the spare node
    assert session.snapshot().check().is_valid


@pytest.mark.parametrize(
    ("edit", "text", "message"),
    [
        (a.set_k, "four", "k: a whole number"),
        (a.set_pipeline_split, "4, x", 'pipeline split: "auto" or layer counts'),
        (a.set_port, "", "port: a whole number"),
    ],
)
def test_typed_nonsense_is_refused_with_what_the_field_wants(
    edit: Callable[[Any, str], bool], text: str, message: str
) -> None:
    session = ConfigSession.open(LOCAL_TOML)
    revision = session.revision
    with pytest.raises(a.FieldInputError, match=message):
        session.edit(lambda d: edit(d, text))
    assert session.revision == revision and not session.is_dirty


def test_out_of_range_values_reach_the_verdict_with_line_and_field(local_copy: Path) -> None:
    session = ConfigSession.open(local_copy)
    session.edit(lambda d: a.set_k(d, "99"))
    session.edit(lambda d: a.set_pipeline_split(d, "3, 3"))
    verdict = judge(session.snapshot().check(), FactsCache(1.0), session.revision)
    assert verdict.kind == "invalid"
    assert any("local.toml:39: deployment.speculation.k" in p for p in verdict.problems)
    assert session.revision == verdict.revision


def test_a_model_too_large_for_the_declared_nodes_does_not_fit(tmp_path: Path) -> None:
    session = ConfigSession.open(write_remote_pair(tmp_path))
    verdict = judge(session.snapshot().check(), FactsCache(1.0), 0)
    assert verdict.kind == "fits", verdict.problems
    session.edit(lambda d: d.set(("models", 0, "dtype"), "bfloat16"))
    verdict = judge(session.snapshot().check(), FactsCache(1.0), 1)
    assert verdict.kind == "does_not_fit"
    assert any("llama-70b" in p for p in verdict.problems), verdict.problems
    assert verdict.plan is not None and verdict.explanation


def test_saving_the_embedded_default_writes_elsewhere_with_paths_rebased(
    local_copy: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "work" / "cluster.toml"
    elsewhere.parent.mkdir()
    session = ConfigSession.open(local_copy, save_path=elsewhere)
    assert session.is_dirty  # not yet where it saves
    session.edit(lambda d: a.set_k(d, "5"))
    assert session.save() == elsewhere
    assert local_copy.read_text() == LOCAL_TOML.read_text()  # the example stays as shipped
    assert 'path = "../packaging/demo-models/target"' in elsewhere.read_text()
    assert "# 5.5M parameters, trained by" in elsewhere.read_text()
    assert load_config(elsewhere).deployment.speculation.k == 5
    assert not session.is_dirty and session.path == elsewhere


def test_an_invalid_file_is_not_saved(local_copy: Path) -> None:
    session = ConfigSession.open(local_copy)
    session.edit(lambda d: a.set_verifier_model(d, "no-such-model"))
    with pytest.raises(ConfigError, match='unknown model "no-such-model"'):
        session.save()
    assert local_copy.read_text() == LOCAL_TOML.read_text()


def test_rebase_leaves_absolute_and_home_paths_alone(tmp_path: Path) -> None:
    session = ConfigSession.open(LOCAL_TOML)
    document = session.document
    document.set(("models", 1, "path"), "/abs/draft")
    document.set(("server", "api_key_file"), "~/key")
    changed = rebase_relative_paths(document, LOCAL_TOML.parent, tmp_path)
    assert changed == [("models", 0, "path")]
    assert document.get(("models", 1, "path")) == "/abs/draft"


def test_models_from_the_catalog_are_added_once(local_copy: Path, tmp_path: Path) -> None:
    session = ConfigSession.open(local_copy)
    llama = (local_copy.parents[1] / "packaging").resolve().parent / "examples" / "models"
    directory = (llama / "llama-3.1-8b-instruct").resolve()
    name = session.edit(lambda d: a.add_model(d, directory))
    assert name == "llama-3.1-8b-instruct"
    assert session.edit(lambda d: a.add_model(d, directory)) == name
    demo = (local_copy.parent / "../packaging/demo-models/draft").resolve()
    assert session.edit(lambda d: a.add_model(d, demo)) == "demo-draft"
    assert len(session.document.get(("models",))) == 3
