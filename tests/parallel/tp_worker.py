"""A rank of a tensor-parallel group in a process of its own (spawned by the sharding tests):
rank 0 runs a prefill and a few decode steps through the leader and reports the logits."""

import multiprocessing as mp
import time
from pathlib import Path

import torch

from daemon.runtime.errors import SpecError
from daemon.runtime.model.batch import ForwardBatch, LogitsMode
from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.runtime.model.loader import load_model
from daemon.runtime.parallel.follower import follow
from daemon.runtime.parallel.group import init_group, leave_group
from daemon.runtime.parallel.leader import TensorParallelLM

PROMPTS = [[5, 17, 99, 3, 250, 8], [42], [7, 7, 7]]
DECODE_STEPS = 3


def batches() -> list[ForwardBatch]:
    """A ragged prefill of three sequences, then greedy-free decode steps of fixed tokens, one
    sequence sitting out each step (a call with fewer rows, as when a sequence drafts none)."""
    out = [ForwardBatch(list(range(3)), PROMPTS, [0, 0, 0], LogitsMode.ALL)]
    lengths = [len(p) for p in PROMPTS]
    for step in range(DECODE_STEPS):
        slots = [s for s in range(3) if s != step]
        out.append(
            ForwardBatch(slots, [[11 + step, 12]] * 2, [lengths[s] for s in slots], LogitsMode.ALL)
        )
        for s in slots:
            lengths[s] += 2
    return out


def run_rank(
    model_dir: str,
    rank: int,
    size: int,
    address: str,
    results: "mp.Queue",
    timeout_s: float = 30,
    leader_delay_s: float = 0.0,
) -> None:
    """Rank `rank` of the group; rank 0 waits `leader_delay_s` before it loads (a slower load)."""
    torch.set_num_threads(1)
    tp = init_group(rank, size, address, timeout_s=timeout_s)
    if rank == 0:
        time.sleep(leader_delay_s)
    model = load_model(model_dir, dtype="float32", num_slots=4, tp=tp)
    assert isinstance(model, LlamaForCausalLM)
    if rank > 0:
        follow(model)
        return
    leader = TensorParallelLM(model)
    try:
        results.put([leader.forward(b) for b in batches()])
    finally:
        leader.close()


def follow_a_leader_that_fails(
    model_dir: str, rank: int, size: int, address: str, results: "mp.Queue"
) -> None:
    """Rank 0 joins the group and leaves it without loading (its load failed); a follower
    reports what its wait for the other ranks ended with, and after how long."""
    torch.set_num_threads(1)
    tp = init_group(rank, size, address, timeout_s=30)
    if rank == 0:
        leave_group(tp)
        return
    model = load_model(model_dir, dtype="float32", num_slots=4, tp=tp)
    assert isinstance(model, LlamaForCausalLM)
    start = time.monotonic()
    try:
        follow(model)
    except SpecError as exc:
        results.put((type(exc).__name__, str(exc), time.monotonic() - start))
        return
    results.put(("returned", "", time.monotonic() - start))


def reference(model_dir: Path) -> list[torch.Tensor]:
    model = load_model(model_dir, dtype="float32", num_slots=4)
    return [model.forward(b) for b in batches()]
