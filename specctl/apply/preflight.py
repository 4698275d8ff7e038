"""Before a running shard is stopped to start a changed one in its place: check, on their
nodes, that the models of every shard this apply starts would load (config.json, tokenizer,
every tensor's name and shape, read from the safetensors headers). A new model path with a
cut-short weights file stopped a serving verifier, then failed to load: no endpoint until the
file was fixed. The shards started beside it are checked too: a verifier replaced to reach a
new pipeline stage or drafter fails, or serves without it, where that one cannot load."""

from typing import TYPE_CHECKING

from daemon.shard.model_check import ModelCheck
from daemon.shard.specs import DrafterSpec, StageSpec, VerifierSpec
from specctl.apply.events import ApplyEvents
from specctl.deploy.checkpoint_check import check_on_nodes

if TYPE_CHECKING:
    from specctl.apply.shards import DesiredShard

STEP = "check models"


class ReplacementRefused(Exception):
    """A shard's model would not load; no running shard was stopped for it."""


def checks_for(shard: "DesiredShard") -> list[ModelCheck]:
    """The model directories `shard` loads, as it loads them, on its node."""
    spec, who, node = shard.spec, shard.step_name, shard.node
    if isinstance(spec, VerifierSpec):
        layers = spec.layers if spec.pipeline_stages else None
        checks = [
            ModelCheck(
                who,
                node,
                spec.target_dir,
                spec.dtype,
                spec.max_model_len,
                spec.tensor_parallel_size,
                layers,
                tokenizer=True,
            )
        ]
        if spec.proposer == "draft_model" and spec.draft_dir:
            checks.append(
                ModelCheck(
                    who,
                    node,
                    spec.draft_dir,
                    spec.dtype,
                    spec.max_model_len,
                    target_dir=spec.target_dir,
                )
            )
        return checks
    if isinstance(spec, StageSpec):
        model_dir, layers = spec.model_dir, spec.layers
        return [ModelCheck(who, node, model_dir, spec.dtype, spec.max_model_len, layers=layers)]
    assert isinstance(spec, DrafterSpec)
    if spec.draft_dir is None:  # n-gram lookup: nothing to load
        return []
    return [
        ModelCheck(
            who, node, spec.draft_dir, spec.dtype, spec.max_model_len, spec.tensor_parallel_size
        )
    ]


def check_before_replacing(
    replacing: list["DesiredShard"], starting: list["DesiredShard"], events: ApplyEvents
) -> None:
    """Where any running shard is to be replaced (`replacing`), check every shard this apply
    starts (`starting`, which holds them); raise ReplacementRefused, before anything is
    stopped, where one would not load. A node that could not be asked (no answer in time)
    does not stop the apply: loading finds the problem, as it did before this check."""
    if not replacing:
        return  # nothing running is stopped: a shard that fails to load costs no service
    checks = list(dict.fromkeys(c for shard in starting for c in checks_for(shard)))
    if not checks:
        return
    names = ", ".join(s.step_name for s in replacing)
    events.step(STEP, "started", f"before replacing {names}")
    results = check_on_nodes(checks)
    if results.problems:
        events.step(STEP, "failed", "; ".join(results.problems))
        raise ReplacementRefused(
            "no running shard was stopped, and they keep serving; the new shards' models would "
            "not load:\n  " + "\n  ".join(results.problems)
        )
    detail = f"{len(checks) - len(results.unchecked)} model directories would load"
    if results.unchecked:
        detail += "; not checked (loading will tell): " + "; ".join(results.unchecked)
    events.step(STEP, "done", detail)
