"""Every test here needs the CPU native kernels; they are built (once per machine) on import."""

from __future__ import annotations

import shutil

import pytest

from bulkrun_kernels import cpu_build

if shutil.which("c++") is None and not __import__("os").environ.get("CXX"):
    pytest.skip(
        "no C++ compiler on this machine: the CPU runs the reference kernels", allow_module_level=True
    )
if not cpu_build.load():
    raise RuntimeError(f"the CPU native kernels failed to build: {cpu_build.load_error()}")
