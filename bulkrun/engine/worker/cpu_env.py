"""Process-level tuning for CPU inference: keep freed activation memory instead of unmapping it.

glibc serves allocations above its mmap threshold with fresh mappings and returns them on free, so
every step's multi-megabyte activations (and each attention group's gathered K/V) are page-faulted
in again, a few microseconds per 4 KiB page. Raising the mmap and trim thresholds keeps that memory
in the heap for reuse (docs/benchmarks.md, design figures). The same advice as tcmalloc/jemalloc for CPU inference, without
the preload.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_THRESHOLD = 1 << 30
_done = False


def keep_freed_memory() -> bool:
    """Raise glibc's mmap/trim thresholds once per process; False where that does not apply."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, _THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _THRESHOLD))
    _done = ok
    return ok
