"""What the bench ran on, written beside its figures (bench.json)."""

import os
import platform
from pathlib import Path

import torch

from daemon.runtime.model import linear, native, skinny


def _cpu_model(cpu: dict[str, str]) -> str:
    return cpu.get("model name") or platform.processor() or "unknown"


def _cpu_flags(cpu: dict[str, str]) -> list[str]:
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "fma")
    flags = cpu.get("flags", "").split()
    return [f for f in wanted if f in flags]


def _cpu_family(cpu: dict[str, str]) -> str | None:
    """The vendor and "family/model" of the first processor (the model name, "AMD EPYC" in a VM,
    does not tell Zen 4 from Zen 5, whose kernels differ: skinny.py)."""
    vendor, family = cpu.get("vendor_id"), cpu.get("cpu family")
    return f"{vendor} {family}/{cpu.get('model')}" if vendor and family else None


def _kernel_paths() -> dict[str, object] | None:
    """The skinny GEMM's paths on this machine (None: not built, or switched off)."""
    in_use = native.enabled() and os.environ.get(linear.SKINNY_ENV, "1") != "0"
    if not (skinny.available() and in_use):
        return None
    return {"wide_min_rows": skinny.wide_min_rows(), "zmm_blocks": skinny.zmm_blocks()}


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    return None


def describe_machine(threads: int | None) -> dict[str, object]:
    gpu = None
    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0)
    cpu = skinny.first_cpu_fields(skinny.cpuinfo_text())  # the first processor's fields
    return {
        "cpu": _cpu_model(cpu),
        "cpu_family": _cpu_family(cpu),
        "cpu_flags": _cpu_flags(cpu),
        "skinny_gemm": _kernel_paths(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "gpu": gpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": threads or torch.get_num_threads(),
        "onednn": torch.backends.mkldnn.is_available(),
    }


def machine_line(machine: dict[str, object]) -> str:
    """One line of describe_machine's figures for a console: what the kernels ran on."""
    family = f" ({machine['cpu_family']})" if machine.get("cpu_family") else ""
    parts = [
        f"{machine['cpu']}{family}, {machine['cores']} cores, "
        f"{machine['torch_threads']} torch thread(s)"
    ]
    paths = machine.get("skinny_gemm")
    if isinstance(paths, dict):
        blocks = "512-bit" if paths["zmm_blocks"] else "256-bit"
        wide = paths["wide_min_rows"]
        parts.append(
            f"skinny GEMM: {blocks} register blocks, "
            + (f"AVX-512 path from {wide} rows" if wide else "no AVX-512 path")
        )
    else:
        parts.append("skinny GEMM not built or switched off: torch's matmuls")
    if machine.get("gpu"):
        parts.append(f"GPU {machine['gpu']}")
    return "; ".join(parts)
