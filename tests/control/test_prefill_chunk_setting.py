"""`[server] prefill_chunk_tokens` reaches the verifier's engine and the drafter apart (which
feeds new prompts as many tokens a round); a bad value is named in place."""

from pathlib import Path

import pytest

from specctl.apply.shards import desired_shards
from specctl.config import load_config
from specctl.planner import gather_node_facts, make_plan

from .cluster_files import MARK, SPARK_5090, first_config_error, replace_line, write_cluster

RUNNABLE = replace_line(SPARK_5090, 'dtype = "fp8"', 'dtype = "bfloat16"')


def _shards(tmp_path: Path, text: str) -> dict[str, tuple[object, str]]:
    path, _ = write_cluster(tmp_path, text)
    config = load_config(path)
    plan = make_plan(config, gather_node_facts(config, mode="offline"))
    return {s.role: (s.spec, s.fingerprint) for s in desired_shards(config, plan, threads=None)}


def test_the_chunk_reaches_both_shards_and_changes_their_fingerprints(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    whole = _shards(tmp_path / "a", RUNNABLE)
    assert whole["verifier"][0].prefill_chunk_tokens is None  # type: ignore[attr-defined]
    assert whole["drafter"][0].feed_chunk_tokens is None  # type: ignore[attr-defined]
    text = replace_line(
        RUNNABLE, "max_batch_size = 8", "max_batch_size = 8\nprefill_chunk_tokens = 256"
    )
    chunked = _shards(tmp_path / "b", text)
    assert chunked["verifier"][0].prefill_chunk_tokens == 256  # type: ignore[attr-defined]
    assert chunked["drafter"][0].feed_chunk_tokens == 256  # type: ignore[attr-defined]
    for role in ("verifier", "drafter"):  # apply redeploys both with the new setting
        assert chunked[role][1] != whole[role][1]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0", "greater than or equal to 1, got 0"), ('"big"', "a valid integer")],
)
def test_a_bad_chunk_is_named_by_file_line_and_field(
    tmp_path: Path, value: str, expected: str
) -> None:
    text = replace_line(
        SPARK_5090,
        "max_batch_size = 8",
        f"max_batch_size = 8\nprefill_chunk_tokens = {value} {MARK}",
    )
    message, number = first_config_error(tmp_path, text)
    assert f":{number}: server.prefill_chunk_tokens: Input should be {expected}" in message
