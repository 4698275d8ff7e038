"""What apply checks before it replaces a running shard: each shard's model directories, as
that shard loads them, on its node."""

from daemon.shard.model_check import ModelCheck
from daemon.shard.specs import DrafterSpec, StageSpec, VerifierSpec
from specctl.apply.events import EventLog
from specctl.apply.preflight import check_before_replacing, checks_for
from specctl.apply.shards import DesiredShard

Spec = VerifierSpec | DrafterSpec | StageSpec


def _shard(role: str, spec: Spec, node: str = "n1") -> DesiredShard:
    actor = f"d.r1.{role}1" if role == "stage" else f"d.r1.{role}"
    return DesiredShard(actor, role, 1, node, spec, "fp", "")


def test_a_verifier_checks_its_target_with_its_tokenizer_and_split() -> None:
    spec = VerifierSpec("/m/t", dtype="bfloat16", max_model_len=512, tensor_parallel_size=2)
    assert checks_for(_shard("verifier", spec)) == [
        ModelCheck("verifier r1", "n1", "/m/t", "bfloat16", 512, 2, None, tokenizer=True)
    ]


def test_a_pipeline_verifier_checks_its_own_layers() -> None:
    spec = VerifierSpec("/m/t", layers=(0, 10), pipeline_stages=["d.r1.stage1"])
    (check,) = checks_for(_shard("verifier", spec))
    assert check.layers == (0, 10)
    alone = VerifierSpec("/m/t", layers=(0, 10))  # no later stage: the whole model
    assert checks_for(_shard("verifier", alone))[0].layers is None


def test_a_colocated_draft_is_checked_against_the_targets_vocabulary() -> None:
    spec = VerifierSpec("/m/t", max_model_len=256, proposer="draft_model", draft_dir="/m/d")
    target, draft = checks_for(_shard("verifier", spec))
    assert target.model_dir == "/m/t" and target.tokenizer
    assert draft == ModelCheck("verifier r1", "n1", "/m/d", "auto", 256, target_dir="/m/t")


def test_a_remote_verifier_checks_its_target_alone() -> None:
    spec = VerifierSpec("/m/t", proposer="remote", drafter_actor="d.r1.drafter")
    assert [c.model_dir for c in checks_for(_shard("verifier", spec))] == ["/m/t"]


def test_a_stage_checks_its_layers_and_a_drafter_its_split() -> None:
    stage = StageSpec("/m/t", layers=(10, 20), num_slots=4, max_model_len=128)
    assert checks_for(_shard("stage", stage, "n2")) == [
        ModelCheck("stage1 r1", "n2", "/m/t", "auto", 128, layers=(10, 20))
    ]
    drafter = DrafterSpec("/m/d", tensor_parallel_size=2, max_model_len=64)
    assert checks_for(_shard("drafter", drafter)) == [
        ModelCheck("drafter r1", "n1", "/m/d", "auto", 64, 2)
    ]
    assert checks_for(_shard("drafter", DrafterSpec(None))) == []  # n-gram: no model


def test_nothing_is_checked_where_nothing_running_is_replaced() -> None:
    """A first apply (or one that only adds shards) loses no service to a shard that fails
    to load: it is not checked (no Ray call is made: no Ray runs in this test)."""
    events = EventLog()
    starting = [_shard("verifier", VerifierSpec("/nowhere"))]
    check_before_replacing([], starting, events)
    assert events.events == []
