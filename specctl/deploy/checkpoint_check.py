"""Check model directories on the nodes that will load them: a Ray task each, placed by the
node label, all at once (daemon/shard/model_check.py runs there)."""

from dataclasses import dataclass

from daemon.shard.model_check import ModelCheck, run_model_check
from daemon.shard.node_context import NODE_LABEL
from specctl.deploy.actors import first_line

CHECK_TIMEOUT_S = 120.0  # a fresh Ray worker imports torch, then reads a few headers


@dataclass(slots=True)
class CheckResults:
    problems: list[str]  # "<shard> on <node>: <what loading would refuse>"
    unchecked: list[str]  # "<shard> on <node>: <why it could not be checked>"


def check_on_nodes(checks: list[ModelCheck], timeout_s: float = CHECK_TIMEOUT_S) -> CheckResults:
    """Run every check on its node, all at once."""
    import ray

    # max_calls=1: the worker exits after its check, rather than idling beside the model
    # about to load, with torch and a tokenizer in its memory
    task = ray.remote(max_calls=1)(run_model_check)
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
        who = f"{check.shard} on {check.node}"
        if ref in not_ready:
            ray.cancel(ref, force=True)
            results.unchecked.append(f"{who}: no answer within {timeout_s:g} s")
            continue
        try:
            result = ray.get(ref, timeout=timeout_s)
        except Exception as exc:  # the worker died, or the task could not run there
            results.unchecked.append(f"{who}: {first_line(exc)}")
            continue
        if result.problem:
            # where it ran, as Ray placed it: a check run elsewhere would prove nothing
            results.problems.append(f"{check.shard} on {result.ran_on}: {result.problem}")
    return results
