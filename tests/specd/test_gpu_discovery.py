"""GPU discovery parsing and fallbacks, against a stand-in NVML module that raises the real
pynvml error classes (the one stand-in the project allows), and against the real pynvml."""

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from daemon.specd.collect import collect_inventory
from daemon.specd.gpu_discovery import discover_gpus

SYSTEM_MEMORY = (128 * 1024**3, 100 * 1024**3)
GIB = 1024**3


def _fake_gpu(**overrides: Any) -> dict[str, Any]:
    gpu = {
        "name": "NVIDIA GeForce RTX 5090",
        "uuid": "GPU-0b6a",
        "memory": SimpleNamespace(total=32 * GIB, used=2 * GIB, free=30 * GIB),
        "rates": SimpleNamespace(gpu=57, memory=12),
        "temperature": 61,
        "power_mw": 312_500,
        "limit_mw": 575_000,
        "capability": (12, 0),
    }
    gpu.update(overrides)
    return gpu


def _value(item: Any) -> Any:
    if isinstance(item, BaseException):
        raise item
    return item


def stand_in_nvml(
    gpus: list[dict[str, Any]], init_error: Exception | None = None, count: Any = None
) -> SimpleNamespace:
    """A module with pynvml's names; an exception instance in place of a value is raised."""

    def field(key: str) -> Callable[..., Any]:
        return lambda handle, *args: _value(gpus[handle][key])

    def init() -> None:
        if init_error is not None:
            raise init_error

    return SimpleNamespace(
        NVMLError=pynvml.NVMLError,
        NVMLError_NotSupported=pynvml.NVMLError_NotSupported,
        NVML_TEMPERATURE_GPU=pynvml.NVML_TEMPERATURE_GPU,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "580.95.05",
        nvmlSystemGetCudaDriverVersion=lambda: 13000,
        nvmlDeviceGetCount=lambda: _value(len(gpus) if count is None else count),
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetName=field("name"),
        nvmlDeviceGetUUID=field("uuid"),
        nvmlDeviceGetMemoryInfo=field("memory"),
        nvmlDeviceGetUtilizationRates=field("rates"),
        nvmlDeviceGetTemperature=field("temperature"),
        nvmlDeviceGetPowerUsage=field("power_mw"),
        nvmlDeviceGetEnforcedPowerLimit=field("limit_mw"),
        nvmlDeviceGetCudaComputeCapability=field("capability"),
    )


def not_supported() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # pynvml maps it to the subclass


def test_full_gpu_is_parsed() -> None:
    report = discover_gpus(stand_in_nvml([_fake_gpu()]), SYSTEM_MEMORY)
    assert report.error is None
    assert report.driver_version == "580.95.05" and report.cuda_version == "13.0"
    (gpu,) = report.gpus
    assert (gpu.index, gpu.name, gpu.uuid) == (0, "NVIDIA GeForce RTX 5090", "GPU-0b6a")
    assert (gpu.memory_total_bytes, gpu.memory_used_bytes, gpu.memory_free_bytes) == (
        32 * GIB,
        2 * GIB,
        30 * GIB,
    )
    assert gpu.unified_memory is False
    assert (gpu.utilization_gpu_percent, gpu.utilization_memory_percent) == (57, 12)
    assert gpu.temperature_c == 61
    assert gpu.power_draw_w == pytest.approx(312.5) and gpu.power_limit_w == pytest.approx(575.0)
    assert gpu.compute_capability == "12.0"


def test_not_supported_error_class_is_the_real_one() -> None:
    assert isinstance(not_supported(), pynvml.NVMLError_NotSupported)


@pytest.mark.parametrize(
    ("key", "attribute"),
    [
        ("rates", "utilization_gpu_percent"),
        ("temperature", "temperature_c"),
        ("power_mw", "power_draw_w"),
        ("limit_mw", "power_limit_w"),
        ("capability", "compute_capability"),
        ("uuid", "uuid"),
        ("name", "name"),
    ],
)
def test_each_unsupported_field_is_null_alone(key: str, attribute: str) -> None:
    report = discover_gpus(stand_in_nvml([_fake_gpu(**{key: not_supported()})]), SYSTEM_MEMORY)
    (gpu,) = report.gpus
    assert getattr(gpu, attribute) is None
    assert gpu.memory_total_bytes == 32 * GIB and gpu.index == 0  # the rest still reported


def test_other_nvml_errors_on_a_field_are_null_too() -> None:
    broken = _fake_gpu(temperature=pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))
    (gpu,) = discover_gpus(stand_in_nvml([broken]), SYSTEM_MEMORY).gpus
    assert gpu.temperature_c is None and gpu.name == "NVIDIA GeForce RTX 5090"


def test_unified_memory_gpu_reports_system_memory() -> None:
    gb10 = _fake_gpu(name=b"NVIDIA GB10", memory=not_supported(), capability=(12, 1))
    (gpu,) = discover_gpus(stand_in_nvml([gb10]), SYSTEM_MEMORY).gpus
    assert gpu.unified_memory is True
    assert gpu.name == "NVIDIA GB10"  # bytes from older pynvml are decoded
    assert gpu.memory_total_bytes == 128 * GIB
    assert gpu.memory_free_bytes == 100 * GIB and gpu.memory_used_bytes == 28 * GIB


@pytest.mark.parametrize(
    "error",
    [
        pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
        pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
        pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION),
    ],
)
def test_no_library_or_driver_means_zero_gpus(error: pynvml.NVMLError) -> None:
    report = discover_gpus(stand_in_nvml([_fake_gpu()], init_error=error), SYSTEM_MEMORY)
    assert report.gpus == [] and report.error == str(error)


def test_device_count_failure_means_zero_gpus() -> None:
    nvml = stand_in_nvml([], count=pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN))
    assert discover_gpus(nvml, SYSTEM_MEMORY).gpus == []


def test_real_nvml_on_this_machine() -> None:
    """Whatever this machine has: with no NVML library the node still reports CPUs and memory."""
    inventory = collect_inventory("here")
    data = inventory.to_json()
    assert data["host"]["num_cpus"] >= 1 and data["host"]["memory_total_bytes"] > 0
    assert data["num_gpus"] == len(data["gpus"])
    if inventory.nvml_error is not None:
        assert data["gpus"] == []
    for gpu in inventory.gpus:
        print(gpu)  # on a GPU machine: what the real NVML reported
        assert gpu.name and gpu.uuid


def test_summary_line_says_cpu_only_or_names_the_gpus() -> None:
    no_lib = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    cpu_only = collect_inventory("n", nvml=stand_in_nvml([], init_error=no_lib))  # type: ignore[arg-type]
    assert cpu_only.summary().startswith("no GPUs, CPU only (")
    with_gpu = collect_inventory("n", nvml=stand_in_nvml([_fake_gpu()]))  # type: ignore[arg-type]
    assert with_gpu.summary().startswith("1 GPU(s): ")
    assert "driver 580.95.05" in with_gpu.summary()
