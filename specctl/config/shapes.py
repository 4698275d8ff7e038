"""Checks against the models' shapes (their config.json): layer counts, tensor-parallel sizes,
context lengths, and that draft and verifier share a vocabulary."""

from pathlib import Path
from typing import NamedTuple

from specctl.config.cluster import ClusterConfig
from specctl.config.errors import Loc
from specctl.config.model_shape import (
    ModelShape,
    ModelShapeError,
    read_model_shape,
    shape_from_file,
)
from specctl.config.node_model_config import FETCH_TIMEOUT_S, first_config, loading_nodes
from specctl.config.references import DRAFTER, VERIFIER, Problem

MAX_TENSOR_PARALLEL = 64


class NodeShape(NamedTuple):
    """A model's shape as a node that loads it read it, or why none could."""

    shape: ModelShape | None
    node: str  # the node that answered ("" if none)
    problem: str  # why no shape ("" if one)
    unreachable: bool = False  # no node that loads the model answered: it may well be there


def read_shapes(
    config: ClusterConfig, nodes_timeout_s: float | None = FETCH_TIMEOUT_S
) -> tuple[dict[str, ModelShape], list[Problem], set[Loc]]:
    """Each model's shape from its config.json: here, or where the model is kept on its nodes
    alone (nothing at its path on this machine), through the specds of the nodes that load it,
    answers awaited `nodes_timeout_s` (None: no node is asked). Last, the problems' places
    where no node answered (the file may be right: its nodes are down)."""
    shapes: dict[str, ModelShape] = {}
    problems: list[Problem] = []
    unreachable: set[Loc] = set()
    for index, model in enumerate(config.models):
        path = config.resolve_path(model.path)
        try:
            shapes[model.name] = read_model_shape(path)
            continue
        except ModelShapeError as error:
            said = str(error)
        loc: Loc = ("models", index, "path")
        if not path.exists():
            found = shape_from_nodes(config, model.name, path, said, nodes_timeout_s)
            if found.shape is not None:
                shapes[model.name] = found.shape
                continue
            said = found.problem
            if found.unreachable:
                unreachable.add(loc)
        problems.append((loc, said))
    return shapes, problems, unreachable


def shape_from_nodes(
    config: ClusterConfig,
    model: str,
    path: Path,
    said_here: str,
    timeout_s: float | None,
) -> NodeShape:
    """The shape of `model` (at `path`, missing here: `said_here`) from the specd of a node
    that loads it."""
    nodes = loading_nodes(config, model)
    if not nodes:
        return NodeShape(
            None,
            "",
            f"{said_here} (on this machine; no node of the deployment loads {model}, so none "
            "could say what it is)",
        )
    if local := [n.name for n in nodes if n.is_local]:
        return NodeShape(
            None,
            "",
            f"{said_here} on this machine, where {_names(local)} would load it (a local node "
            "runs here)",
        )
    if timeout_s is None:
        said = f"{said_here} on this machine; its nodes were not asked (offline)"
        return NodeShape(None, "", said, unreachable=True)  # not known to be wrong either
    node, raw, answers, none_answered = first_config(config, nodes, path, timeout_s)
    if node is None or raw is None:
        said = f"{said_here} on this machine, nor on its nodes: " + "; ".join(answers)
        return NodeShape(None, "", said, unreachable=none_answered)
    try:
        return NodeShape(shape_from_file(raw, f"{node.name}:{path / 'config.json'}"), node.name, "")
    except ModelShapeError as error:
        return NodeShape(None, "", str(error))


def _names(nodes: list[str]) -> str:
    return f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {', '.join(nodes)}"


def check_shapes(config: ClusterConfig, shapes: dict[str, ModelShape]) -> list[Problem]:
    problems = _context_lengths(config, shapes)
    if problems:  # the checks below compare context lengths: one mistake, one error
        return problems
    verifier = config.deployment.verifier
    target = shapes[verifier.model]
    problems += _tensor_parallel(
        (*VERIFIER, "tensor_parallel_size"), verifier.tensor_parallel_size, verifier.model, target
    )
    problems += _layers(config, target)
    drafter = config.deployment.drafter
    if not drafter.is_ngram:
        draft = shapes[drafter.model]
        problems += _tensor_parallel(
            (*DRAFTER, "tensor_parallel_size"), drafter.tensor_parallel_size, drafter.model, draft
        )
        problems += _draft_matches_target(config, draft, target)
    return problems


def valid_tensor_parallel_sizes(shape: ModelShape) -> list[int]:
    """Sizes that split the attention heads evenly and the KV heads evenly or by replication."""
    return [
        size
        for size in range(1, MAX_TENSOR_PARALLEL + 1)
        if shape.num_attention_heads % size == 0
        and (shape.num_kv_heads % size == 0 or size % shape.num_kv_heads == 0)
    ]


def _tensor_parallel(loc: Loc, size: int, model: str, shape: ModelShape) -> list[Problem]:
    valid = valid_tensor_parallel_sizes(shape)
    if size in valid:
        return []
    return [
        (
            loc,
            f"{size} does not divide {model}'s {shape.num_attention_heads} attention heads and "
            f"{shape.num_kv_heads} KV heads; valid sizes: {', '.join(map(str, valid))}",
        )
    ]


def _layers(config: ClusterConfig, target: ModelShape) -> list[Problem]:
    verifier = config.deployment.verifier
    num_layers = target.num_layers
    if len(verifier.nodes) > num_layers:
        return [
            (
                (*VERIFIER, "nodes"),
                f"{len(verifier.nodes)} pipeline stages for {verifier.model}'s {num_layers} "
                "layers; each stage needs at least one layer",
            )
        ]
    split = verifier.pipeline_split
    if split == "auto" or sum(split) == num_layers:
        return []
    return [
        (
            (*VERIFIER, "pipeline_split"),
            f"layer counts {split} sum to {sum(split)}, but {verifier.model} has {num_layers} "
            f'layers; make them sum to {num_layers}, or use "auto"',
        )
    ]


def _context_lengths(config: ClusterConfig, shapes: dict[str, ModelShape]) -> list[Problem]:
    problems: list[Problem] = []
    for index, model in enumerate(config.models):
        limit = shapes[model.name].max_position_embeddings
        if model.max_model_len is not None and model.max_model_len > limit:
            problems.append(
                (
                    ("models", index, "max_model_len"),
                    f"{model.max_model_len} exceeds {model.name}'s max_position_embeddings "
                    f"{limit}; use at most {limit}",
                )
            )
    return problems


def _draft_matches_target(
    config: ClusterConfig, draft: ModelShape, target: ModelShape
) -> list[Problem]:
    drafter = config.deployment.drafter
    verifier = config.deployment.verifier
    loc: Loc = (*DRAFTER, "model")
    if draft.vocab_size != target.vocab_size:
        return [
            (
                loc,
                f"{drafter.model} has a vocabulary of {draft.vocab_size}, {verifier.model} of "
                f"{target.vocab_size}: draft and verifier need the same tokenizer",
            )
        ]
    context = config.model(verifier.model).max_model_len or target.max_position_embeddings
    if draft.max_position_embeddings < context:
        return [
            (
                loc,
                f"{drafter.model} handles {draft.max_position_embeddings} positions, fewer than "
                f"the verifier's context {context}; lower {verifier.model}'s max_model_len to "
                f"{draft.max_position_embeddings} or pick another draft",
            )
        ]
    return []
