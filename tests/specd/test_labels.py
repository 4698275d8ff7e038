"""Labels derived from the inventory are ones Ray itself accepts; caller labels are checked
by the same rules Ray uses (its own validator is the oracle)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ray._private.label_utils import parse_node_labels_string, validate_node_label_syntax

from daemon.specd.inventory import GpuInfo, HostInfo, Inventory
from daemon.specd.labels import (
    derived_labels,
    format_labels,
    label_key_error,
    label_value_error,
    sanitize_value,
)

GIB = 1024**3


def _inventory(*gpus: GpuInfo, node_name: str = "spark 1 (lab)") -> Inventory:
    host = HostInfo(
        hostname="h", num_cpus=20, memory_total_bytes=128 * GIB, memory_available_bytes=1
    )
    return Inventory(node_name=node_name, host=host, gpus=list(gpus))


@given(st.text(max_size=200))
def test_sanitized_values_are_valid_ray_label_values(raw: str) -> None:
    value = sanitize_value(raw)
    validate_node_label_syntax({"k": value})
    assert label_value_error(value) is None


def test_gpu_names_become_readable_values() -> None:
    assert sanitize_value("NVIDIA GeForce RTX 5090") == "NVIDIA-GeForce-RTX-5090"
    assert sanitize_value("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert sanitize_value("  --(x)--  ") == "x"
    assert sanitize_value("???") == "unknown"


def test_derived_labels_for_a_unified_memory_node() -> None:
    gb10 = GpuInfo(index=0, name="NVIDIA GB10", memory_total_bytes=128 * GIB, unified_memory=True)
    labels = derived_labels(_inventory(gb10))
    assert labels == {
        "specd.io/node": "spark-1-lab",
        "specd.io/gpu-model": "NVIDIA-GB10",
        "specd.io/gpu-count": "1",
        "specd.io/gpu-memory-gib": "128",
        "specd.io/system-memory-gib": "128",
        "specd.io/unified-memory": "true",
    }
    assert parse_node_labels_string(format_labels(labels)) == labels  # Ray reads it back


def test_derived_labels_for_cpu_only_and_mixed_nodes() -> None:
    assert derived_labels(_inventory())["specd.io/gpu-model"] == "none"
    mixed = derived_labels(
        _inventory(
            GpuInfo(index=0, name="A", memory_total_bytes=24 * GIB),
            GpuInfo(index=1, name="B", memory_total_bytes=12 * GIB),
        )
    )
    assert mixed["specd.io/gpu-model"] == "mixed" and mixed["specd.io/gpu-memory-gib"] == "12"


@pytest.mark.parametrize(
    "key", ["zone", "team.example.com/zone", "a", "x-1_y.z", "b" * 63, "example.com/" + "c" * 63]
)
def test_valid_keys_match_ray(key: str) -> None:
    assert label_key_error(key) is None
    validate_node_label_syntax({key: "v"})


@pytest.mark.parametrize(
    "key", ["", "-zone", "zone-", "a b", "a=b", "a,b", "b" * 64, "-bad/x", "a/"]
)
def test_invalid_keys_match_ray(key: str) -> None:
    assert label_key_error(key) is not None
    with pytest.raises(ValueError):
        validate_node_label_syntax({key: "v"})


@pytest.mark.parametrize("key", ["ray.io/node-id", "specd.io/node"])
def test_reserved_prefixes_are_refused(key: str) -> None:
    assert "reserved" in (label_key_error(key) or "")


@pytest.mark.parametrize("value", ["", "-x", "x y", "a,b=c", "v" * 64])
def test_invalid_values(value: str) -> None:
    assert label_value_error(value) is not None
