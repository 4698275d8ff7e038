"""The lean runner split over 2 and 4 tensor-parallel ranks (processes joined by gloo) computes
the logits of the whole model, K/V heads split (2 ranks) or replicated (4 ranks over 2 K/V
heads), through ragged prefill and decode steps in which some sequences sit out."""

import multiprocessing as mp
from collections.abc import Callable
from typing import Any

import pytest
import torch

from daemon.runtime.errors import ModelLoadError
from daemon.runtime.model.config import ModelConfig
from daemon.runtime.model.loader import read_raw_config
from daemon.runtime.model.sharding import shard_config
from daemon.runtime.parallel.group import pick_address
from specctl.demo_pair import demo_pair_dirs
from tests.parallel.tp_worker import follow_a_leader_that_fails, reference, run_rank

pytestmark = pytest.mark.timeout(300)


def _run_group(
    target: Callable[..., None], size: int, *args: object
) -> tuple[Any, list[int | None]]:
    """Ranks 0..size-1 running `target` in processes of their own; the first result any of
    them reports, and their exit codes."""
    model_dir, _ = demo_pair_dirs()
    context = mp.get_context("spawn")
    results = context.Queue()
    address = pick_address()
    ranks = [
        context.Process(target=target, args=(str(model_dir), r, size, address, results, *args))
        for r in range(size)
    ]
    for process in ranks:
        process.start()
    try:
        got = results.get(timeout=120)
    finally:
        for process in ranks:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    return got, [p.exitcode for p in ranks]


@pytest.mark.parametrize("size", [2, 4])  # the target: 4 heads, 2 K/V heads
def test_tensor_parallel_logits_equal_the_whole_model(size: int) -> None:
    model_dir, _ = demo_pair_dirs()
    got, exit_codes = _run_group(run_rank, size)
    assert exit_codes == [0] * size
    expected = reference(model_dir)
    assert len(got) == len(expected)
    for step, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=f"step {step}")


def test_a_follower_waits_out_a_rank_0_that_loads_longer_than_the_group_timeout() -> None:
    """Rank 1 loads and waits for rank 0's first command; rank 0 starts loading 3 group
    timeouts later. The group's timeout bounds each collective, not the others' loads."""
    model_dir, _ = demo_pair_dirs()
    got, exit_codes = _run_group(run_rank, 2, 4.0, 12.0)  # timeout_s, leader_delay_s
    assert exit_codes == [0, 0]
    expected = reference(model_dir)
    assert isinstance(got, list)
    for step, (a, b) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=f"step {step}")


def test_a_follower_learns_at_once_that_rank_0_failed_to_load() -> None:
    got, exit_codes = _run_group(follow_a_leader_that_fails, 2)
    assert exit_codes == [0, 0]
    kind, message, waited_s = got
    assert kind == "ModelLoadError", (kind, message)
    assert "rank 1 of 2: waiting for every rank to load its shard" in message
    assert waited_s < 30  # not the 900 s load timeout


def test_a_size_that_splits_nothing_evenly_is_refused_by_name() -> None:
    target, _ = demo_pair_dirs()
    config = ModelConfig.from_dict(read_raw_config(target), source="target/config.json")
    with pytest.raises(ModelLoadError, match="tensor_parallel_size 3 must divide num_attention"):
        shard_config(config, 3)
