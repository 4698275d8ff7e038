"""The one compiled part: the CPU runner's skinny GEMM (daemon/runtime/model/_skinny_gemm.c).

Optional: where it cannot be built (no C compiler, another architecture) the install goes on
and the runner uses oneDNN's matmul instead (daemon/runtime/model/skinny.py says which ran).
Everything else is declared in pyproject.toml.
"""

import platform

from setuptools import Extension, setup

IS_X86_64 = platform.machine().lower() in ("x86_64", "amd64")

setup(
    ext_modules=[
        Extension(
            "daemon.runtime.model._skinny_gemm",
            sources=["daemon/runtime/model/_skinny_gemm.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall"],
            extra_link_args=["-pthread"] if IS_X86_64 else [],
            optional=True,
        )
    ]
)
