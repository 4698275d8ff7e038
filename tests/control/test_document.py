"""Editing a cluster file: one changed field changes one line; comments and order stay."""

import difflib
import shutil
from pathlib import Path

import pytest

from specctl.config import ConfigDocument, ConfigError, load_config

from .cluster_files import EXAMPLES


def _copy_example(tmp_path: Path) -> Path:
    shutil.copytree(EXAMPLES / "models", tmp_path / "models")
    target = tmp_path / "spark-5090.toml"
    shutil.copy(EXAMPLES / "spark-5090.toml", target)
    return target


def _changed_lines(before: str, after: str) -> list[str]:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]


def test_change_one_field_and_only_that_line_changes(tmp_path: Path) -> None:
    path = _copy_example(tmp_path)
    before = path.read_text()
    doc = ConfigDocument.load(path)
    assert doc.get(("deployment", "speculation", "k")) == 4
    doc.set(("deployment", "speculation", "k"), 6)
    doc.save()
    after = path.read_text()
    assert _changed_lines(before, after) == [
        "-k = 4                        # tokens drafted per round; or `adaptive = true` with "
        "`max_k = 8`",
        "+k = 6                        # tokens drafted per round; or `adaptive = true` with "
        "`max_k = 8`",
    ]
    assert load_config(path).deployment.speculation.k == 6


def test_move_the_drafter_and_edit_an_array_of_tables(tmp_path: Path) -> None:
    path = _copy_example(tmp_path)
    before = path.read_text()
    doc = ConfigDocument.load(path)
    doc.set(("deployment", "drafter", "node"), "spark")
    doc.set(("nodes", 1, "memory_utilization"), 0.8)
    config = doc.validate()
    assert config.deployment.drafter.node == "spark"
    assert config.node("rtx5090").memory_utilization == 0.8
    doc.save()
    changed = _changed_lines(before, path.read_text())
    assert sorted(line[0] for line in changed) == ["+", "+", "-", "-"]
    assert '+node = "spark"' in changed
    assert (
        "+memory_utilization = 0.8     # share of each GPU's memory the shards may use "
        "(default 0.9)" in changed
    )


def test_new_tables_and_nodes_are_added_and_validate(tmp_path: Path) -> None:
    path = _copy_example(tmp_path)
    doc = ConfigDocument.load(path)
    doc.remove(("deployment", "speculation"))
    doc.set(("deployment", "speculation", "adaptive"), True)
    doc.set(("deployment", "speculation", "max_k"), 8)
    index = doc.append_table(
        "nodes", {"name": "old-3090", "specd": "old.local:7601", "gpus": [{"memory_gib": 24}]}
    )
    assert index == 2
    doc.set(("server", "api_key_file"), None)  # absent: removing is a no-op
    config = doc.validate()
    assert config.deployment.speculation.adaptive and config.deployment.speculation.ceiling_k == 8
    assert [n.name for n in config.nodes] == ["spark", "rtx5090", "old-3090"]
    doc.save()
    assert "# ---- the machines" in path.read_text()  # comments survive
    assert load_config(path).node("old-3090").gpus[0].memory_gib == 24


def test_an_invalid_edit_is_not_saved(tmp_path: Path) -> None:
    path = _copy_example(tmp_path)
    path.chmod(0o640)
    before = path.read_text()
    doc = ConfigDocument.load(path)
    doc.set(("deployment", "drafter", "node"), "gpu-b")
    with pytest.raises(ConfigError, match=r'deployment\.drafter\.node: unknown node "gpu-b"'):
        doc.save()
    assert path.read_text() == before
    doc.set(("deployment", "drafter", "node"), "rtx5090")
    doc.save()
    assert path.stat().st_mode & 0o777 == 0o640  # the file keeps its mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "spark-5090.toml"]


def test_syntax_error_on_load_is_the_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[[nodes]]\nname = \n")
    with pytest.raises(ConfigError, match=r"broken\.toml:2: invalid TOML: Invalid value"):
        ConfigDocument.load(path)


def test_every_field_is_documented_in_the_examples_readme() -> None:
    from specctl.config import schema

    readme = (EXAMPLES / "README.md").read_text()
    for model in (
        schema.NodeSpec,
        schema.GpuDeclaration,
        schema.ModelSpec,
        schema.DeploymentSpec,
        schema.VerifierSpec,
        schema.DrafterSpec,
        schema.SpeculationSpec,
        schema.ServerSpec,
    ):
        for name, info in model.model_fields.items():
            assert f"| `{name}` |" in readme, f"{model.__name__}.{name} is not documented"
            assert info.description, f"{model.__name__}.{name} has no description"
