"""GPU discovery through NVML (nvidia-ml-py's `pynvml` module).

Every field is queried on its own, so one field NVML cannot report (NOT_SUPPORTED on a consumer
card, on GB10, ...) becomes None instead of hiding the rest. The module is a parameter: the real
`pynvml` in the daemon, a stand-in raising the real pynvml error classes in the parsing tests.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from daemon.specd.inventory import GpuInfo

logger = logging.getLogger(__name__)

MILLIWATTS_PER_WATT = 1000.0


@dataclass(slots=True)
class NvmlReport:
    gpus: list[GpuInfo]
    driver_version: str | None
    cuda_version: str | None
    error: str | None  # set when NVML itself could not start: no library, no driver


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _query(nvml: ModuleType, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Call one NVML function; any NVML error becomes None (logged unless NOT_SUPPORTED)."""
    try:
        return fn(*args)
    except nvml.NVMLError as error:
        if not isinstance(error, nvml.NVMLError_NotSupported):
            logger.warning("NVML %s failed: %s", what, error)
        return None


def _cuda_version(raw: int | None) -> str | None:
    # nvmlSystemGetCudaDriverVersion returns 1000 * major + 10 * minor, e.g. 12080 -> "12.8"
    return None if raw is None else f"{raw // 1000}.{(raw % 1000) // 10}"


def _watts(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / MILLIWATTS_PER_WATT


def _fill_memory(nvml: ModuleType, handle: Any, gpu: GpuInfo, system: tuple[int, int]) -> None:
    try:
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    except nvml.NVMLError_NotSupported:
        total, available = system
        gpu.unified_memory = True
        gpu.memory_total_bytes = total
        gpu.memory_free_bytes = available
        gpu.memory_used_bytes = total - available
        return
    except nvml.NVMLError as error:
        logger.warning("NVML memory info of GPU %d failed: %s", gpu.index, error)
        return
    gpu.memory_total_bytes = int(memory.total)
    gpu.memory_used_bytes = int(memory.used)
    gpu.memory_free_bytes = int(memory.free)


def _read_gpu(nvml: ModuleType, index: int, system: tuple[int, int]) -> GpuInfo:
    gpu = GpuInfo(index=index)
    handle = _query(nvml, f"handle of GPU {index}", nvml.nvmlDeviceGetHandleByIndex, index)
    if handle is None:
        return gpu
    name = _query(nvml, "name", nvml.nvmlDeviceGetName, handle)
    uuid = _query(nvml, "uuid", nvml.nvmlDeviceGetUUID, handle)
    gpu.name = None if name is None else _text(name)
    gpu.uuid = None if uuid is None else _text(uuid)
    _fill_memory(nvml, handle, gpu, system)
    rates = _query(nvml, "utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
    if rates is not None:
        gpu.utilization_gpu_percent = int(rates.gpu)
        gpu.utilization_memory_percent = int(rates.memory)
    gpu.temperature_c = _query(
        nvml, "temperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
    )
    gpu.power_draw_w = _watts(_query(nvml, "power", nvml.nvmlDeviceGetPowerUsage, handle))
    gpu.power_limit_w = _watts(
        _query(nvml, "power limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    )
    capability = _query(nvml, "compute capability", nvml.nvmlDeviceGetCudaComputeCapability, handle)
    gpu.compute_capability = None if capability is None else f"{capability[0]}.{capability[1]}"
    return gpu


def discover_gpus(nvml: ModuleType, system_memory: tuple[int, int]) -> NvmlReport:
    """Read every GPU NVML sees. `system_memory` is (total, available) bytes of the host,
    reported for unified-memory GPUs. Never raises an NVML error: without a library or a
    driver the report has no GPUs and says why."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        return NvmlReport(gpus=[], driver_version=None, cuda_version=None, error=str(error))
    try:
        driver = _query(nvml, "driver version", nvml.nvmlSystemGetDriverVersion)
        cuda = _query(nvml, "CUDA version", nvml.nvmlSystemGetCudaDriverVersion)
        count = _query(nvml, "device count", nvml.nvmlDeviceGetCount) or 0
        gpus = [_read_gpu(nvml, index, system_memory) for index in range(count)]
    finally:
        _query(nvml, "shutdown", nvml.nvmlShutdown)
    return NvmlReport(
        gpus=gpus,
        driver_version=None if driver is None else _text(driver),
        cuda_version=_cuda_version(cuda),
        error=None,
    )
