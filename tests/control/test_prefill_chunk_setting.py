"""`[server] prefill_chunk_tokens` reaches the verifier's engine; a bad value is named in place."""

from pathlib import Path

import pytest

from specctl.apply.shards import desired_shards
from specctl.config import load_config
from specctl.planner import gather_node_facts, make_plan

from .cluster_files import MARK, SPARK_5090, first_config_error, replace_line, write_cluster

RUNNABLE = replace_line(SPARK_5090, 'dtype = "fp8"', 'dtype = "bfloat16"')


def _verifier(tmp_path: Path, text: str) -> tuple[object, str]:
    path, _ = write_cluster(tmp_path, text)
    config = load_config(path)
    plan = make_plan(config, gather_node_facts(config, mode="offline"))
    shard = next(s for s in desired_shards(config, plan, threads=None) if s.role == "verifier")
    return shard.spec, shard.fingerprint


def test_the_chunk_reaches_the_verifier_and_changes_its_fingerprint(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    whole, whole_print = _verifier(tmp_path / "a", RUNNABLE)
    assert whole.prefill_chunk_tokens is None  # type: ignore[attr-defined]
    text = replace_line(
        RUNNABLE, "max_batch_size = 8", "max_batch_size = 8\nprefill_chunk_tokens = 256"
    )
    chunked, chunked_print = _verifier(tmp_path / "b", text)
    assert chunked.prefill_chunk_tokens == 256  # type: ignore[attr-defined]
    assert chunked_print != whole_print  # apply redeploys the verifier with the new setting


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
