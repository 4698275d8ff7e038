"""`proposal_tokens` / `proposal_mass` under [deployment.speculation] reach whichever process
drafts: the drafter shard when it runs apart, the verifier's engine when it is colocated."""

from pathlib import Path

import pytest

from specctl.apply.shards import desired_shards
from specctl.config import load_config
from specctl.planner import gather_node_facts, make_plan

from .cluster_files import MARK, SPARK_5090, first_config_error, replace_line, write_cluster

# the example plans its 70B in fp8, which the runtime does not load: bfloat16 here
RUNNABLE = replace_line(SPARK_5090, 'dtype = "fp8"', 'dtype = "bfloat16"')
WITH_PROPOSALS = replace_line(
    RUNNABLE,
    'mode = "overlapped"',
    'mode = "overlapped"\nproposal_tokens = 1024\nproposal_mass = 0.9\nproposal_max_tokens = 3000',
)


def _shards(tmp_path: Path, text: str) -> dict[str, object]:
    path, _ = write_cluster(tmp_path, text)
    config = load_config(path)
    plan = make_plan(config, gather_node_facts(config, mode="offline"))
    return {shard.role: shard.spec for shard in desired_shards(config, plan, threads=None)}


def test_a_drafter_apart_gets_the_proposal_settings(tmp_path: Path) -> None:
    shards = _shards(tmp_path, WITH_PROPOSALS)
    drafter, verifier = shards["drafter"], shards["verifier"]
    assert (drafter.sparse_top_k, drafter.sparse_mass) == (1024, 0.9)  # type: ignore[attr-defined]
    assert drafter.sparse_max_listed == 3000  # type: ignore[attr-defined]
    # the verifier does not draft: its own settings stay the defaults (no redeploy on a change)
    assert (verifier.sparse_top_k, verifier.sparse_mass) == (32, 1.0)  # type: ignore[attr-defined]
    assert verifier.sparse_max_listed is None  # type: ignore[attr-defined]


def test_a_colocated_drafter_gets_them_in_the_verifier(tmp_path: Path) -> None:
    text = replace_line(WITH_PROPOSALS, 'node = "rtx5090"', 'node = "spark"')
    shards = _shards(tmp_path, text)
    assert "drafter" not in shards
    verifier = shards["verifier"]
    assert (verifier.sparse_top_k, verifier.sparse_mass) == (1024, 0.9)  # type: ignore[attr-defined]
    assert verifier.sparse_max_listed == 3000  # type: ignore[attr-defined]


def test_zero_tokens_is_coupled_drafting_on_the_drafter(tmp_path: Path) -> None:
    text = replace_line(RUNNABLE, 'mode = "overlapped"', 'mode = "overlapped"\nproposal_tokens = 0')
    drafter = _shards(tmp_path, text)["drafter"]
    assert drafter.sparse_top_k == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("proposal_tokens = 5000", "less than or equal to 4095, got 5000"),
        ("proposal_tokens = -1", "greater than or equal to 0, got -1"),
        ("proposal_mass = 0", "greater than 0, got 0"),
        ("proposal_max_tokens = 5000", "less than or equal to 4095, got 5000"),
        ("choose_proposal = 3", "a valid boolean, got 3"),
    ],
)
def test_out_of_range_is_a_clear_error(tmp_path: Path, line: str, expected: str) -> None:
    text = replace_line(SPARK_5090, 'mode = "overlapped"', f"{line} {MARK}")
    message, number = first_config_error(tmp_path, text)
    field = line.split(" ")[0]
    assert f":{number}: deployment.speculation.{field}: Input should be {expected}" in message


def test_a_list_that_cannot_widen_from_its_base_is_a_clear_error(tmp_path: Path) -> None:
    text = replace_line(
        SPARK_5090,
        'mode = "overlapped"',
        f'mode = "overlapped"\nproposal_tokens = 64\nproposal_max_tokens = 32 {MARK}',
    )
    message, _ = first_config_error(tmp_path, text)
    assert "deployment.speculation" in message
    assert "proposal_max_tokens (32) must be >= proposal_tokens (64)" in message


def test_the_proposal_choice_reaches_the_verifier(tmp_path: Path) -> None:
    """The verifier measures listed proposals against coupled drafts by default, wherever the
    drafter runs; `choose_proposal = false`, or nothing listed to choose against, turns it off."""
    for name in "abcd":
        (tmp_path / name).mkdir()
    assert _shards(tmp_path / "a", WITH_PROPOSALS)["verifier"].choose_proposal  # type: ignore[attr-defined]
    off = replace_line(
        WITH_PROPOSALS, "proposal_mass = 0.9", "proposal_mass = 0.9\nchoose_proposal = false"
    )
    assert not _shards(tmp_path / "b", off)["verifier"].choose_proposal  # type: ignore[attr-defined]
    coupled = replace_line(
        RUNNABLE, 'mode = "overlapped"', 'mode = "overlapped"\nproposal_tokens = 0'
    )
    assert not _shards(tmp_path / "c", coupled)["verifier"].choose_proposal  # type: ignore[attr-defined]
    colocated = replace_line(off, 'node = "rtx5090"', 'node = "spark"')
    assert not _shards(tmp_path / "d", colocated)["verifier"].choose_proposal  # type: ignore[attr-defined]
