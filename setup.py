"""The one compiled part: the CPU runner's kernels (daemon/runtime/model/_cpu_kernels.c).

Optional: where it cannot be built (no C compiler, another architecture) the install goes on
and the runner uses torch's ops instead (oneDNN's matmul, torch's rms_norm; native.py).
Everything else is declared in pyproject.toml.
"""

import platform

from setuptools import Extension, setup

IS_X86_64 = platform.machine().lower() in ("x86_64", "amd64")

setup(
    ext_modules=[
        Extension(
            "daemon.runtime.model._cpu_kernels",
            sources=["daemon/runtime/model/_cpu_kernels.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall"],
            extra_link_args=["-pthread", "-lm"] if IS_X86_64 else ["-lm"],
            optional=True,
        )
    ]
)
