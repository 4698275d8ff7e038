"""Check model directories on the nodes that will load them, through Ray, reading only their
config.json and safetensors headers (daemon/runtime/model/checkpoint_check.py)."""

from dataclasses import dataclass

from daemon.shard.node_context import NODE_LABEL

CHECK_TIMEOUT_S = 120.0  # a fresh Ray worker imports torch, then reads a few headers


@dataclass(frozen=True, slots=True)
class CheckpointCheck:
    node: str  # the node's name in cluster.toml (its specctl.io/node label)
    model_dir: str
    dtype: str = "auto"
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    layers: tuple[int, int] | None = None
    tokenizer: bool = False  # a verifier's target: its tokenizer loads too


@dataclass(slots=True)
class CheckResults:
    problems: list[str]  # "<node>: <what loading would refuse>"
    unchecked: list[str]  # "<node>: <why it could not be checked>" (timed out, worker died)


def check_on_nodes(
    checks: list[CheckpointCheck], timeout_s: float = CHECK_TIMEOUT_S
) -> CheckResults:
    """Run every check on its node, all at once."""
    import ray

    task = ray.remote(_check_here)
    refs = [
        task.options(
            label_selector={NODE_LABEL: check.node},
            num_cpus=0,
            max_retries=0,
            name=f"specctl check {check.model_dir}",
        ).remote(check)
        for check in checks
    ]
    _, not_ready = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    results = CheckResults([], [])
    for check, ref in zip(checks, refs, strict=True):
        if ref in not_ready:
            ray.cancel(ref, force=True)
            results.unchecked.append(f"{check.node}: no answer within {timeout_s:g} s")
            continue
        try:
            problem = ray.get(ref, timeout=timeout_s)
        except Exception as exc:  # the worker died, or the task could not run there
            results.unchecked.append(f"{check.node}: {type(exc).__name__}: {exc}")
            continue
        if problem:
            results.problems.append(f"{check.node}: {problem}")
    return results


def _check_here(check: CheckpointCheck) -> str | None:
    """On the node: what loading `check.model_dir` would refuse, or None."""
    from pathlib import Path

    from daemon.runtime.engine.builder import load_tokenizer
    from daemon.runtime.errors import ModelLoadError
    from daemon.runtime.model.checkpoint_check import check_checkpoint

    try:
        if check.tokenizer:
            load_tokenizer(Path(check.model_dir))
        check_checkpoint(
            check.model_dir,
            dtype=check.dtype,
            max_model_len=check.max_model_len,
            tensor_parallel_size=check.tensor_parallel_size,
            layers=check.layers,
        )
    except ModelLoadError as error:
        return str(error)
    return None
