"""Building the CPU kernels: once per machine and source, and a clean fallback when it cannot be done."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bulkrun_kernels import cpu_build, get_ops


def test_cpu_backend_runs_the_native_ops():
    ops = get_ops("cpu", "cpu")
    assert ops.backend == "cpu"
    assert ops.paged_attention.__module__ == "bulkrun_kernels.cpu_ops"
    assert get_ops("auto", "cpu").backend == "cpu"


def test_a_built_library_is_reused_not_rebuilt():
    path = cpu_build.build()
    before = path.stat().st_mtime_ns
    assert cpu_build.build() == path and path.stat().st_mtime_ns == before


def _child(code: str, tmp_path, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "BULKRUN_CACHE_DIR": str(tmp_path), **env}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_without_a_compiler_auto_falls_back_and_cpu_names_the_reason(tmp_path):
    code = (
        "from bulkrun_kernels import get_ops\n"
        "print(get_ops('auto', 'cpu').backend)\n"
        "try:\n    get_ops('cpu', 'cpu')\nexcept ValueError as e:\n    print('refused:', e)\n"
    )
    done = _child(code, tmp_path, CXX="/nonexistent/c++")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "reference"
    assert lines[1].startswith("refused: kernel backend 'cpu' could not be built here: no C++ compiler")
    assert "using the PyTorch reference kernels" in done.stderr  # logged once, as a warning


def test_another_build_can_be_named(monkeypatch, tmp_path):
    """BULKRUN_CPU_LIBRARY loads the named build as it is (A/B runs of two sources), compiling nothing."""
    library = tmp_path / "other" / "bulkrun_cpu.so"
    monkeypatch.setenv("BULKRUN_CPU_LIBRARY", str(library))
    monkeypatch.setattr(cpu_build, "_compile", lambda *a: pytest.fail("compiled"))
    assert cpu_build.build() == library


# AVX2 + FMA only; AVX-512 without bf16 dot products (fp32 by default there); AVX-512 BF16 + AMX
@pytest.mark.parametrize("march", ["haswell", "cascadelake", "sapphirerapids"])
def test_the_kernels_compile_for_cpus_other_than_this_one(march):
    """A build compiles only this CPU's paths; the others (AVX2's halves, AMX tiles) are checked here."""
    if not cpu_build.compiler_available():
        pytest.skip("no C++ compiler")
    probe = subprocess.run(
        [cpu_build.compiler(), f"-march={march}", "-x", "c++", "-fsyntax-only", os.devnull],
        capture_output=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"this compiler does not know -march={march}")
    cpu_build.check_compiles_for(march)
