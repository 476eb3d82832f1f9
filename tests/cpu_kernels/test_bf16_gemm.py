"""The fixed-order bf16 GEMMs (AMX tiles, AVX512-BF16 dot products; each where the CPU has it): the
product to bf16 accuracy, and each row's bits whatever rows share the call."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from bulkrun_kernels import cpu_build
from bulkrun_kernels.cpu_gemm import amx_available, bf16_gemm, dpbf16_available, pack_amx, pad_bias

G = torch.Generator().manual_seed(0)
NATIVE = cpu_build.compiler_available() and cpu_build.load()
NEEDS_AMX = pytest.mark.skipif(not (NATIVE and amx_available()), reason="no AMX here")
KERNELS = [
    pytest.param("amx", marks=NEEDS_AMX),
    pytest.param(
        "dpbf16", marks=pytest.mark.skipif(not (NATIVE and dpbf16_available()), reason="no AVX512-BF16")
    ),
]


@pytest.fixture(params=KERNELS)
def kernel(request):
    return request.param


def gemm(kernel, *args):
    return bf16_gemm(*args, kernel=kernel)


def _case(n, k, bias):
    w = torch.randn(n, k, generator=G).bfloat16()
    b = torch.randn(n, generator=G) if bias else None
    wp = pack_amx(w)
    return w, b, wp, pad_bias(b, wp)


@pytest.mark.parametrize(("n", "k"), [(960, 576), (576, 1536), (49, 32), (100, 64), (3072, 576), (40, 96)])
@pytest.mark.parametrize("bias", [False, True])
# rows: a decode-sized call and a prompt step's (amx runs the latter in its own loop order)
@pytest.mark.parametrize("rows", [37, 1000])
def test_matches_fp32_product(n, k, bias, rows, kernel):
    w, b, wp, bp = _case(n, k, bias)
    x = torch.randn(rows, k, generator=G).bfloat16()
    want = x.float() @ w.float().T + (b if bias else 0)
    got = gemm(kernel, x, wp, bp, n, torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-3)  # fp32 output: only sum order differs
    # bf16 output: the same sums, rounded once (against `want` rounded, a sum order that differs in the
    # last fp32 bit can land on the other side of a bf16 rounding)
    assert torch.equal(gemm(kernel, x, wp, bp, n), got.bfloat16())


@pytest.mark.parametrize(("n", "k"), [(960, 576), (576, 1536), (3072, 576), (40, 96)])
def test_rows_do_not_depend_on_the_batch(n, k, kernel):
    # 1,100 rows: amx_gemm runs calls of 768 rows and more in another loop order (K in chunks, C
    # carried between them); a row's bits must not tell which
    _, _, wp, bp = _case(n, k, True)
    x = torch.randn(1100, k, generator=G).bfloat16()
    full = gemm(kernel, x, wp, bp, n)
    for rows in (1, 2, 5, 6, 7, 15, 16, 17, 31, 32, 33, 100, 239, 240, 241, 299, 767, 768, 801, 1099):
        assert torch.equal(gemm(kernel, x[:rows], wp, bp, n), full[:rows]), rows
    assert torch.equal(gemm(kernel, x[1090:], wp, bp, n), full[1090:])
    perm = torch.randperm(1100, generator=G)
    assert torch.equal(gemm(kernel, x[perm], wp, bp, n), full[perm])
    assert torch.equal(gemm(kernel, x, wp, bp, n, torch.float32).bfloat16(), full)
    strided = torch.zeros(1100, k + 64, dtype=torch.bfloat16)[:, 32 : 32 + k]
    strided.copy_(x)
    assert torch.equal(gemm(kernel, strided, wp, bp, n), full)


@pytest.mark.parametrize("rows", [5, 800])
def test_an_empty_reduction_gives_the_bias(rows, kernel):
    _, b, wp, bp = _case(40, 0, True)
    assert torch.equal(
        gemm(kernel, torch.zeros(rows, 0, dtype=torch.bfloat16), wp, bp, 40), b.bfloat16().expand(rows, 40)
    )


def test_rejects_bad_input(kernel):
    _, _, wp, _ = _case(64, 64, False)
    with pytest.raises(TypeError, match="bfloat16"):
        gemm(kernel, torch.randn(2, 64), wp, None, 64)
    with pytest.raises(RuntimeError, match="columns"):
        gemm(kernel, torch.randn(2, 96).bfloat16(), wp, None, 64)
    with pytest.raises(ValueError, match="multiple of 32"):
        pack_amx(torch.randn(8, 40))


_FIRST_CALL = """
import sys, torch
from bulkrun_kernels import cpu_build
from bulkrun_kernels.cpu_gemm import pack_amx
assert cpu_build.load()
x, w = torch.randn(3, 64).bfloat16(), torch.randn(40, 64).bfloat16()
y = torch.empty(3, 40, dtype=torch.bfloat16)
try:
    torch.ops.bulkrun_cpu.amx_gemm(x, pack_amx(w), None, y)
except RuntimeError as e:
    print("refused:", e)
    sys.exit(3)
assert torch.equal(y, (x.float() @ w.float().T).bfloat16())
"""


@NEEDS_AMX
@pytest.mark.parametrize("amx_env", ["1", "0"])
def test_amx_gemm_called_first_in_a_process(amx_env):
    # Linux grants AMX's tile state only on request: an op called before anything asked must ask
    # itself, not die of SIGILL; with BULKRUN_CPU_AMX=0 it refuses with an error
    env = {**os.environ, "BULKRUN_CPU_AMX": amx_env}
    done = subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env, capture_output=True, text=True)
    assert done.returncode == (0 if amx_env == "1" else 3), done.stderr[-2000:]
    if amx_env == "0":
        assert "AMX is off" in done.stdout
