"""Every test here needs the CPU native kernels; they are built (once per machine) on import.

Without a C++ compiler these tests are skipped (the CPU then runs the reference kernels); with one,
a failed build is an error here rather than a silent fallback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bulkrun_kernels import cpu_build

HERE = Path(__file__).resolve().parent
HAS_COMPILER = cpu_build.compiler_available()
if HAS_COMPILER and not cpu_build.load():
    raise RuntimeError(f"the CPU native kernels failed to build: {cpu_build.load_error()}")


def pytest_collection_modifyitems(config, items):
    if HAS_COMPILER:
        return
    skip = pytest.mark.skip(reason="no C++ compiler on this machine: the CPU runs the reference kernels")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)
