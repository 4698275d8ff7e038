"""Build an engine from model directories: load, check the pair, wire the proposer."""

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.errors import IncompatibleModelsError, ModelLoadError
from daemon.runtime.model import load_model
from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.runtime.parallel.group import TensorParallel
from daemon.runtime.parallel.leader import as_leader
from daemon.runtime.parallel.pipeline import PipelineLM, Stage
from daemon.runtime.proposers.base import Proposer
from daemon.runtime.proposers.draft_model import DraftModelProposer
from daemon.runtime.proposers.ngram import NgramProposer

# (which model: "target" | "draft", bytes loaded, total bytes), as weights arrive.
BuildProgress = Callable[[str, int, int], None]


@dataclass(slots=True)
class EngineSpec:
    target: Path
    draft: Path | None = None
    ngram: bool = False
    dtype: str = "auto"
    device: str = "cpu"
    backend: str = "auto"  # "auto" | "lean" | "hf"
    max_model_len: int | None = None
    engine: EngineConfig | None = None
    proposer: Proposer | None = None  # built elsewhere (a remote drafter): no draft, no ngram
    target_tp: TensorParallel | None = None  # this process is rank 0 of the target's TP group
    target_layers: tuple[int, int] | None = None  # the first pipeline stage's layers [0, end)
    target_stages: list[Stage] | None = None  # the later pipeline stages, in order


@dataclass(slots=True)
class BuiltEngine:
    engine: SpecEngine
    tokenizer: Any  # a transformers tokenizer


def build_engine(spec: EngineSpec, progress: BuildProgress | None = None) -> BuiltEngine:
    """Load the tokenizer first (cheap, and the vocabulary check needs it), then the models."""
    if sum((spec.draft is not None, spec.ngram, spec.proposer is not None)) > 1:
        raise ModelLoadError("choose one proposer: a draft model, n-gram lookup or a remote one")
    config = spec.engine or EngineConfig()
    tokenizer = load_tokenizer(spec.target)
    if spec.draft is not None:
        check_same_vocabulary(spec.target, spec.draft, tokenizer)
    load = functools.partial(
        load_model,
        dtype=spec.dtype,
        device=spec.device,
        num_slots=config.max_batch_size,
        backend=spec.backend,
    )
    target = as_leader(
        load(
            spec.target,
            max_model_len=spec.max_model_len,
            progress=_named(progress, "target"),
            tp=spec.target_tp,
            layers=spec.target_layers,
        )
    )
    if spec.target_stages:
        assert isinstance(target, LlamaForCausalLM)
        target = PipelineLM(target, spec.target_stages)
    proposer: Proposer | None = spec.proposer
    if spec.draft is not None:
        draft = load(
            spec.draft, max_model_len=target.max_model_len, progress=_named(progress, "draft")
        )
        proposer = DraftModelProposer(
            draft,
            sparse_top_k=config.draft_sparse_top_k,
            sparse_mass=config.draft_sparse_mass,
            max_listed=config.draft_sparse_max_listed,
            max_prefill_tokens=config.max_prefill_tokens,
            prefill_chunk_tokens=config.prefill_chunk_tokens,
        )
    elif spec.ngram:
        proposer = NgramProposer()
    engine = SpecEngine(
        target,
        proposer,
        config,
        eos_token_ids=eos_token_ids(spec.target, tokenizer),
        detokenize=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
    )
    return BuiltEngine(engine=engine, tokenizer=tokenizer)


def _named(progress: BuildProgress | None, name: str) -> Callable[[int, int], None] | None:
    if progress is None:
        return None
    return functools.partial(progress, name)


def load_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    if not (model_dir / "config.json").is_file():
        raise ModelLoadError(f"{model_dir}: not a model directory (no config.json)")
    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{model_dir}: cannot load a tokenizer ({exc})") from exc


def check_same_vocabulary(target_dir: Path, draft_dir: Path, target_tokenizer: Any) -> None:
    """The verifier can only judge drafts written in its own vocabulary."""
    draft_tokenizer = load_tokenizer(draft_dir)
    if draft_tokenizer.get_vocab() != target_tokenizer.get_vocab():
        raise IncompatibleModelsError(
            f"draft {draft_dir} and target {target_dir} have different vocabularies "
            f"({len(draft_tokenizer)} vs {len(target_tokenizer)} tokens); "
            "speculative decoding needs the same tokenizer"
        )
    target_vocab = _config(target_dir).get("vocab_size")
    draft_vocab = _config(draft_dir).get("vocab_size")
    if target_vocab != draft_vocab:
        raise IncompatibleModelsError(
            f"draft {draft_dir} has vocab_size {draft_vocab} but target {target_dir} has "
            f"{target_vocab} in config.json"
        )


def eos_token_ids(model_dir: Path, tokenizer: Any) -> set[int]:
    """EOS ids from generation_config.json, config.json and the tokenizer, merged."""
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        value = _json(model_dir / name).get("eos_token_id")
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def _config(model_dir: Path) -> dict[str, Any]:
    return _json(model_dir / "config.json")


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc})") from exc
    return data if isinstance(data, dict) else {}
