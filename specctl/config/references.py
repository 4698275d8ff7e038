"""Checks across sections that need no model file: names that must exist, names that must be
unique, the API key file. Each problem keeps the path of the field it is about."""

import stat
from pathlib import Path

from specctl.config.cluster import ClusterConfig
from specctl.config.errors import Loc
from specctl.config.schema import NGRAM

Problem = tuple[Loc, str]

VERIFIER: Loc = ("deployment", "verifier")
DRAFTER: Loc = ("deployment", "drafter")


def _one_of(kind: str, names: list[str]) -> str:
    distinct = list(dict.fromkeys(names))  # a duplicate name has its own error already
    return f"{kind} are: {', '.join(distinct)}" if distinct else f"no {kind} are declared"


def check_references(config: ClusterConfig) -> list[Problem]:
    return [
        *_duplicates(config),
        *_verifier_references(config),
        *_drafter_references(config),
        *_api_key_file(config),
    ]


def _duplicates(config: ClusterConfig) -> list[Problem]:
    problems: list[Problem] = []
    for section, names in (
        ("nodes", [n.name for n in config.nodes]),
        ("models", [m.name for m in config.models]),
    ):
        for index, name in enumerate(names):
            first = names.index(name)
            if first != index:
                problems.append(
                    ((section, index, "name"), f'duplicate name "{name}" (also {section}[{first}])')
                )
    addresses = [n.specd for n in config.nodes]
    for index, address in enumerate(addresses):
        first = addresses.index(address)
        if first != index and not config.nodes[index].is_local:
            problems.append(
                (
                    ("nodes", index, "specd"),
                    f"{address} is also nodes[{first}]'s specd: one machine is one node "
                    "(several GPUs of it go in its gpus)",
                )
            )
    for index, model in enumerate(config.models):
        if model.name == NGRAM:
            problems.append(
                ((("models", index, "name")), '"ngram" is reserved for the n-gram drafter')
            )
    return problems


def _verifier_references(config: ClusterConfig) -> list[Problem]:
    node_names = [n.name for n in config.nodes]
    model_names = [m.name for m in config.models]
    verifier = config.deployment.verifier
    problems: list[Problem] = []
    if verifier.model not in model_names:
        problems.append(
            (
                (*VERIFIER, "model"),
                f'unknown model "{verifier.model}"; ' + _one_of("models", model_names),
            )
        )
    for index, name in enumerate(verifier.nodes):
        if name not in node_names:
            problems.append(
                (
                    (*VERIFIER, "nodes", index),
                    f'unknown node "{name}"; ' + _one_of("nodes", node_names),
                )
            )
        elif verifier.nodes.index(name) != index:
            problems.append(
                ((*VERIFIER, "nodes", index), f'node "{name}" is listed twice; one stage per node')
            )
    split = verifier.pipeline_split
    if split != "auto" and len(split) != len(verifier.nodes):
        problems.append(
            (
                (*VERIFIER, "pipeline_split"),
                f"{len(split)} layer count(s) for {len(verifier.nodes)} verifier node(s) "
                f'({", ".join(verifier.nodes)}); give one count per node, or "auto"',
            )
        )
    return problems


def _drafter_references(config: ClusterConfig) -> list[Problem]:
    node_names = [n.name for n in config.nodes]
    model_names = [m.name for m in config.models]
    drafter = config.deployment.drafter
    if drafter.is_ngram:
        problems = []
        if drafter.node is not None:
            problems.append(
                ((*DRAFTER, "node"), "the n-gram drafter runs inside the verifier; remove node")
            )
        if drafter.tensor_parallel_size != 1:
            problems.append(
                (
                    (*DRAFTER, "tensor_parallel_size"),
                    "the n-gram drafter has no model to split; remove tensor_parallel_size",
                )
            )
        return problems
    problems: list[Problem] = []
    if drafter.model not in model_names:
        problems.append(
            (
                (*DRAFTER, "model"),
                f'unknown model "{drafter.model}"; '
                + _one_of("models", model_names)
                + ', or "ngram"',
            )
        )
    if drafter.node is None:
        problems.append(
            (
                (*DRAFTER, "node"),
                "required for a draft model: the node it runs on; " + _one_of("nodes", node_names),
            )
        )
    elif drafter.node not in node_names:
        problems.append(
            ((*DRAFTER, "node"), f'unknown node "{drafter.node}"; ' + _one_of("nodes", node_names))
        )
    return problems


def _api_key_file(config: ClusterConfig) -> list[Problem]:
    path = config.api_key_path()
    if path is None:
        return []
    loc: Loc = ("server", "api_key_file")
    try:
        info = path.stat()
    except FileNotFoundError:
        return [(loc, f"{path} not found (a file holding the API key, mode 0600)")]
    except OSError as error:
        return [(loc, f"{path}: cannot read it: {error.strerror}")]
    if not stat.S_ISREG(info.st_mode):
        return [(loc, f"{path} is not a regular file")]
    if info.st_mode & 0o077:
        mode = stat.S_IMODE(info.st_mode)
        return [(loc, f"{path} has mode {mode:04o}: readable by others; chmod 600 {path}")]
    if not _has_content(path):
        return [(loc, f"{path} is empty; it must hold the API key")]
    return []


def _has_content(path: Path) -> bool:
    try:
        return bool(path.read_text(encoding="utf-8").strip())
    except (OSError, UnicodeDecodeError):
        return False
