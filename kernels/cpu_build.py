"""Build and load the CPU native kernels (kernels/cpu/*.cpp) once per machine.

The library is compiled on first use with the system C++ compiler ($CXX, else c++) against the
installed torch, tuned for this CPU (-march=native), into $BULKRUN_CACHE_DIR/kernels/<key>/ (default
~/.cache/bulkrun). The key hashes the sources, the torch version and the CPU's model and flags, so
a changed source, a torch upgrade or a home directory shared by different machines triggers a fresh
build rather than loading a stale or foreign one. Concurrent processes take a file lock: one
compiles, the others wait and load its result.

Where no compiler exists or the build fails, `load()` returns None and logs why once; the caller
then runs the PyTorch references (slower, same results).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

log = logging.getLogger("bulkrun.kernels")
SOURCE_DIR = Path(__file__).resolve().parent / "cpu"
# every source and header of kernels/cpu: a new kernel file joins the build (and its hash) by existing
SOURCES = tuple(sorted(p.name for p in SOURCE_DIR.glob("*.cpp")))
HEADERS = tuple(sorted(p.name for p in SOURCE_DIR.glob("*.h")))
LIBRARY = "bulkrun_cpu.so"

_state: dict[str, object] = {}  # "loaded": bool, "error": str


def load() -> bool:
    """True once torch.ops.bulkrun_cpu is usable in this process (building it if needed)."""
    if "loaded" not in _state:
        try:
            torch.ops.load_library(str(build()))
            _state["loaded"] = True
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            _state["loaded"], _state["error"] = False, str(exc)
            log.warning("CPU native kernels unavailable (%s); using the PyTorch reference kernels", exc)
    return bool(_state["loaded"])


def load_error() -> str | None:
    return _state.get("error")  # type: ignore[return-value]


def cache_base() -> Path:
    """$BULKRUN_CACHE_DIR, default ~/.cache/bulkrun: what bulkrun builds once per machine lives here."""
    return Path(os.environ.get("BULKRUN_CACHE_DIR") or Path.home() / ".cache" / "bulkrun")


def cache_root() -> Path:
    return cache_base() / "kernels"


def build() -> Path:
    """The path of the built library, compiling it first when this machine has none yet.
    $BULKRUN_CPU_LIBRARY names another build to load instead (A/B measurements of two sources)."""
    if os.environ.get("BULKRUN_CPU_LIBRARY"):
        return Path(os.environ["BULKRUN_CPU_LIBRARY"])
    target_dir = cache_root() / _build_key()
    target = target_dir / LIBRARY
    if target.exists():
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    with open(target_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one compiler per machine; the others wait for its result
        if not target.exists():
            _compile(target_dir, target)
    return target


def compiler_available() -> bool:
    try:
        compiler()
    except RuntimeError:
        return False
    return True


def compiler() -> str:
    cxx = os.environ.get("CXX") or "c++"
    if shutil.which(cxx) is None:
        raise RuntimeError(f"no C++ compiler found ({cxx!r}); set CXX or install g++")
    return cxx


def _torch_dirs() -> tuple[list[str], str]:
    root = Path(torch.__file__).resolve().parent
    return [str(root / "include"), str(root / "include" / "torch" / "csrc" / "api" / "include")], str(
        root / "lib"
    )


def _flags() -> list[str]:
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return ["-O3", "-march=native", "-std=c++20", "-fopenmp", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]


def _build_key() -> str:
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update((SOURCE_DIR / name).read_bytes())
    h.update(" ".join([torch.__version__, platform.machine(), sys.platform, *_flags()]).encode())
    h.update(_cpu_signature().encode())
    return h.hexdigest()[:16]


def cpu_flags() -> frozenset[str]:
    """The instruction-set flags /proc/cpuinfo lists (empty where there is none)."""
    lines = _cpuinfo_lines(("flags", "Features"))
    return frozenset(flag for ln in lines for flag in ln.split(":", 1)[-1].split())


@functools.cache  # /proc/cpuinfo once: the linears ask on every call
def has_avx512() -> bool:
    """Whether the CPU has AVX-512: the kernels' 16-lane vectors are one register there, two AVX2
    registers elsewhere, and a few paths are chosen by it (bulkrun.model.linear)."""
    return "avx512f" in cpu_flags()


def _cpu_signature() -> str:
    """The CPU model and flags lines of /proc/cpuinfo (-march=native code is only valid there)."""
    lines = _cpuinfo_lines(("model name", "flags", "Features", "CPU part"))
    return "\n".join(sorted(set(lines))) if lines else platform.processor()


def _cpuinfo_lines(keys: tuple[str, ...]) -> list[str]:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []
    return [ln for ln in lines if ln.split(":")[0].strip() in keys]


def _compile(target_dir: Path, target: Path) -> None:
    cxx, (includes, lib_dir) = compiler(), _torch_dirs()
    # worth a line: the first job waits for it (~50 s on 2 cores, AVX-512 or AVX2)
    log.info("compiling the CPU native kernels once for this machine (about a minute)")
    with tempfile.TemporaryDirectory(dir=target_dir) as tmp:
        objects = [str(Path(tmp) / (name + ".o")) for name in SOURCES]
        compile_cmds = [
            [*_compile_command(cxx, includes, src, _flags()), "-c", "-o", obj]
            for src, obj in zip(SOURCES, objects, strict=True)
        ]
        with ThreadPoolExecutor(len(compile_cmds)) as pool:  # the sources compile in parallel
            list(pool.map(_run, compile_cmds))  # re-raises the first failure
        staged = Path(tmp) / LIBRARY
        _run([cxx, "-shared", "-fopenmp", *objects, f"-L{lib_dir}", "-lc10", "-ltorch_cpu",
              f"-Wl,-rpath,{lib_dir}", "-o", str(staged)])  # fmt: skip
        os.replace(staged, target)  # atomic: a reader sees no library or a whole one


def check_compiles_for(march: str) -> None:
    """Compile every source for another CPU (`-march=<march>`), syntax and template instantiation
    only: the paths this machine's build leaves out (AVX2's 8-lane halves, AMX tiles) must compile
    too. RuntimeError names the first failure."""
    cxx, (includes, _) = compiler(), _torch_dirs()
    flags = [f for f in _flags() if not f.startswith("-march=")] + [f"-march={march}", "-fsyntax-only"]
    cmds = [_compile_command(cxx, includes, src, flags) for src in SOURCES]
    with ThreadPoolExecutor(len(cmds)) as pool:
        list(pool.map(_run, cmds))


def _compile_command(cxx: str, includes: list[str], src: str, flags: list[str]) -> list[str]:
    return [cxx, *flags, *(f"-I{i}" for i in includes), str(SOURCE_DIR / src)]


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-12:]
        raise RuntimeError(f"compiling the CPU kernels failed: {' '.join(cmd[:2])} ...\n" + "\n".join(tail))
