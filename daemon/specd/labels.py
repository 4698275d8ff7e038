"""Ray node labels: syntax checks and the labels derived from the inventory.

Ray follows Kubernetes label syntax (ray/_private/label_utils.py): a key is an optional DNS
subdomain prefix and '/', then a name; a name or value is at most 63 characters of
[A-Za-z0-9_.-], beginning and ending with an alphanumeric. Keys under `ray.io/` belong to Ray
and keys under `specd.io/` to the labels specd derives here, so callers may use neither.
"""

import re

from daemon.specd.inventory import Inventory

LABEL_NAME_MAX_CHARS = 63
LABEL_PREFIX_MAX_CHARS = 253
DERIVED_PREFIX = "specd.io/"
RESERVED_PREFIXES = ("ray.io/", DERIVED_PREFIX)
UNKNOWN_VALUE = "unknown"
BYTES_PER_GIB = 1024**3

_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")
_INVALID_RUN = re.compile(r"[^A-Za-z0-9_.-]+")


def label_key_error(key: str) -> str | None:
    """Why `key` is not a valid label key for specd callers, or None if it is."""
    if key.startswith(RESERVED_PREFIXES):
        return f"label key {key!r} uses a reserved prefix ({', '.join(RESERVED_PREFIXES)})"
    prefix, _, name = key.rpartition("/")
    if prefix and (
        len(prefix) > LABEL_PREFIX_MAX_CHARS
        or not all(_NAME.fullmatch(part) for part in prefix.split("."))
    ):
        return f"label key prefix {prefix!r} must be names separated by dots"
    if not _NAME.fullmatch(name):
        return (
            f"label key name {name!r} must be 1-63 characters of letters, digits, '-', '_', '.',"
            " beginning and ending with a letter or digit"
        )
    return None


def label_value_error(value: str) -> str | None:
    """Why `value` is not a valid label value, or None if it is."""
    if not _NAME.fullmatch(value):
        return (
            f"label value {value!r} must be 1-63 characters of letters, digits, '-', '_', '.',"
            " beginning and ending with a letter or digit"
        )
    return None


def sanitize_value(raw: str) -> str:
    """Turn any text (a GPU name such as 'NVIDIA GeForce RTX 5090') into a valid label value."""
    value = _INVALID_RUN.sub("-", raw.strip())[:LABEL_NAME_MAX_CHARS]
    value = value.strip("-_.")
    return value or UNKNOWN_VALUE


def _gpu_model(inventory: Inventory) -> str:
    names = {gpu.name or UNKNOWN_VALUE for gpu in inventory.gpus}
    if not names:
        return "none"
    return sanitize_value(names.pop()) if len(names) == 1 else "mixed"


def _gib(num_bytes: int | None) -> str:
    return "0" if num_bytes is None else str(num_bytes // BYTES_PER_GIB)


def derived_labels(inventory: Inventory) -> dict[str, str]:
    """Labels describing the node, for scheduling shards onto it by label."""
    gpu_memory = [gpu.memory_total_bytes or 0 for gpu in inventory.gpus]
    return {
        f"{DERIVED_PREFIX}node": sanitize_value(inventory.node_name),
        f"{DERIVED_PREFIX}gpu-model": _gpu_model(inventory),
        f"{DERIVED_PREFIX}gpu-count": str(inventory.num_gpus),
        # the smallest GPU bounds what a shard spread over this node's GPUs can hold
        f"{DERIVED_PREFIX}gpu-memory-gib": _gib(min(gpu_memory)) if gpu_memory else "0",
        f"{DERIVED_PREFIX}system-memory-gib": _gib(inventory.host.memory_total_bytes),
        f"{DERIVED_PREFIX}unified-memory": str(
            any(gpu.unified_memory for gpu in inventory.gpus)
        ).lower(),
    }


def format_labels(labels: dict[str, str]) -> str:
    """The `ray start --labels` argument: key=value pairs joined by commas."""
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
