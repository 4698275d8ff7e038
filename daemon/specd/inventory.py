"""What a node has: its GPUs (from NVML), CPUs and memory. Plain dataclasses, JSON-ready."""

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class GpuInfo:
    """One GPU. Any field NVML cannot report on this GPU (NOT_SUPPORTED, ...) is None."""

    index: int
    name: str | None = None
    uuid: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    # True for GPUs sharing system memory (GB10 in the DGX Spark): their memory queries
    # return NOT_SUPPORTED, so the memory_* fields above report system memory instead.
    unified_memory: bool = False
    utilization_gpu_percent: int | None = None
    utilization_memory_percent: int | None = None
    temperature_c: int | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    compute_capability: str | None = None  # "major.minor", e.g. "9.0"


@dataclass(slots=True)
class HostInfo:
    hostname: str
    num_cpus: int
    memory_total_bytes: int
    memory_available_bytes: int


@dataclass(slots=True)
class Inventory:
    node_name: str
    host: HostInfo
    gpus: list[GpuInfo] = field(default_factory=list)
    driver_version: str | None = None
    cuda_version: str | None = None  # the CUDA version the driver supports, e.g. "12.8"
    nvml_error: str | None = None  # why no GPUs were found, when NVML could not start

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    def summary(self) -> str:
        """One line for the log at startup, e.g. "no GPUs, CPU only (...); 2 CPUs, 23.5 GiB"."""
        host = f"{self.host.num_cpus} CPUs, {self.host.memory_total_bytes / 2**30:.1f} GiB"
        if not self.gpus:
            why = f" ({self.nvml_error})" if self.nvml_error else ""
            return f"no GPUs, CPU only{why}; {host}"
        names = ", ".join(sorted({g.name or "unknown GPU" for g in self.gpus}))
        return f"{self.num_gpus} GPU(s): {names}; driver {self.driver_version}; {host}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["num_gpus"] = self.num_gpus
        return data
