"""Before a running shard is stopped to start a changed one in its place: check, on its node,
that the new one's model directories would load (config.json, tokenizer, every tensor's name
and shape, from the headers alone). A new model path with a missing or truncated weights file
stopped a serving verifier, then failed to load: no endpoint until the file was fixed."""

from typing import TYPE_CHECKING

from daemon.shard.specs import DrafterSpec, StageSpec, VerifierSpec
from specctl.apply.events import ApplyEvents
from specctl.deploy.checkpoint_check import CheckpointCheck, check_on_nodes

if TYPE_CHECKING:
    from specctl.apply.shards import DesiredShard

STEP = "check models"


class ReplacementRefused(Exception):
    """A changed shard's model would not load; the running one was left as it was."""


def checks_for(shard: "DesiredShard") -> list[CheckpointCheck]:
    """The model directories `shard` loads, as it loads them, on its node."""
    spec = shard.spec
    if isinstance(spec, VerifierSpec):
        checks = [
            CheckpointCheck(
                shard.node,
                spec.target_dir,
                spec.dtype,
                spec.max_model_len,
                spec.tensor_parallel_size,
                spec.layers if spec.pipeline_stages else None,
                tokenizer=True,
            )
        ]
        if spec.proposer == "draft_model" and spec.draft_dir:
            checks.append(
                CheckpointCheck(shard.node, spec.draft_dir, spec.dtype, spec.max_model_len)
            )
        return checks
    if isinstance(spec, StageSpec):
        return [
            CheckpointCheck(
                shard.node, spec.model_dir, spec.dtype, spec.max_model_len, layers=spec.layers
            )
        ]
    assert isinstance(spec, DrafterSpec)
    if spec.draft_dir is None:  # n-gram lookup: nothing to load
        return []
    return [
        CheckpointCheck(
            shard.node,
            spec.draft_dir,
            spec.dtype,
            spec.max_model_len,
            spec.tensor_parallel_size,
        )
    ]


def check_replacements(replacing: list["DesiredShard"], events: ApplyEvents) -> None:
    """Raise ReplacementRefused, before anything is stopped, where a shard replacing a running
    one would not load. A node that could not be asked (no answer in time) does not stop the
    apply: loading finds the problem, as it did before this check."""
    checks = list(dict.fromkeys(c for shard in replacing for c in checks_for(shard)))
    if not checks:
        return
    names = ", ".join(sorted({f"{s.role} r{s.replica}" for s in replacing}))
    events.step(STEP, "started", f"before replacing {names}")
    results = check_on_nodes(checks)
    if results.problems:
        events.step(STEP, "failed", "; ".join(results.problems))
        raise ReplacementRefused(
            "nothing was changed; the running shards keep serving. The new model would not "
            "load:\n  " + "\n  ".join(results.problems)
        )
    detail = f"{len(checks)} model directories would load"
    if results.unchecked:
        detail = "not checked: " + "; ".join(results.unchecked)
    events.step(STEP, "done", detail)
