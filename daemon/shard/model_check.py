"""A model directory checked on the node that is to load it (a Ray task placed there by
`apply`): what loading would refuse, from config.json, the tokenizer and the safetensors
headers alone (daemon/runtime/model/checkpoint_check.py)."""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ModelCheck:
    shard: str  # who loads it ("verifier r0"), for the report
    node: str  # the node's name in cluster.toml, where the check is placed
    model_dir: str
    dtype: str = "auto"
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    layers: tuple[int, int] | None = None
    tokenizer: bool = False  # a verifier's target: its tokenizer loads too
    target_dir: str | None = None  # a draft in the verifier's process: the same vocabulary


@dataclass(frozen=True, slots=True)
class ModelCheckResult:
    ran_on: str  # the node the check ran on (its specctl.io/node label)
    problem: str | None  # what loading would refuse; None: nothing found


def run_model_check(check: ModelCheck) -> ModelCheckResult:
    from daemon.runtime.engine.builder import check_same_vocabulary, load_tokenizer
    from daemon.runtime.errors import ModelLoadError
    from daemon.runtime.model.checkpoint_check import check_checkpoint
    from daemon.shard.node_context import NodeContext

    ran_on = NodeContext.current().node_name
    try:
        if check.tokenizer:
            load_tokenizer(Path(check.model_dir))
        if check.target_dir is not None:
            target = Path(check.target_dir)
            check_same_vocabulary(target, Path(check.model_dir), load_tokenizer(target))
        check_checkpoint(
            check.model_dir,
            dtype=check.dtype,
            max_model_len=check.max_model_len,
            tensor_parallel_size=check.tensor_parallel_size,
            layers=check.layers,
        )
    except ModelLoadError as error:
        return ModelCheckResult(ran_on, str(error))
    return ModelCheckResult(ran_on, None)
