"""Build the node's Inventory: host facts plus what NVML reports."""

from types import ModuleType

import pynvml

from daemon.specd.gpu_discovery import discover_gpus
from daemon.specd.host_info import collect_host_info
from daemon.specd.inventory import Inventory


def collect_inventory(node_name: str, nvml: ModuleType = pynvml) -> Inventory:
    host = collect_host_info()
    report = discover_gpus(nvml, (host.memory_total_bytes, host.memory_available_bytes))
    return Inventory(
        node_name=node_name,
        host=host,
        gpus=report.gpus,
        driver_version=report.driver_version,
        cuda_version=report.cuda_version,
        nvml_error=report.error,
    )
