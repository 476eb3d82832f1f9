"""amx_gemm_gated, a gate_up projection with its gated activation applied to its own output: the
bits of amx_gemm then silu_and_mul / gelu_tanh_and_mul, whatever rows share the call; and a model's
GatedMLP taking it once packed."""

from __future__ import annotations

import pytest
import torch

from bulkrun_kernels import cpu_build
from bulkrun_kernels.cpu_gemm import (
    bf16_gemm,
    gated_gemm,
    gated_gemm_available,
    interleave_gate_up,
    pack_amx,
    pad_bias,
)

G = torch.Generator().manual_seed(0)
pytestmark = pytest.mark.skipif(
    not (cpu_build.compiler_available() and cpu_build.load() and gated_gemm_available()), reason="no AMX here"
)
OPS = {"silu": "silu_and_mul", "gelu_tanh": "gelu_tanh_and_mul"}


def _case(inter: int, k: int, bias: bool):
    w = (torch.randn(2 * inter, k, generator=G) * 0.2).bfloat16()
    b = torch.randn(2 * inter, generator=G) if bias else None
    wp = pack_amx(w)
    return wp, pad_bias(b, wp)


def _unfused(x, wp, bp, inter, activation):
    h = bf16_gemm(x, wp, bp, 2 * inter)
    out = torch.empty(x.shape[0], inter, dtype=torch.bfloat16)
    getattr(torch.ops.bulkrun_cpu, OPS[activation])(h, out)
    return out


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize(("inter", "k"), [(1536, 576), (64, 96), (16, 32)])
@pytest.mark.parametrize("bias", [False, True])
# a decode-sized call and a prompt step's (amx_gemm runs 768 rows and more in another loop order)
@pytest.mark.parametrize("rows", [1, 37, 1000])
def test_the_bits_of_the_product_then_the_activation(activation, inter, k, bias, rows):
    wp, bp = _case(inter, k, bias)
    x = torch.randn(rows, k, generator=G).bfloat16()
    want = _unfused(x, wp, bp, inter, activation)
    got = gated_gemm(x, interleave_gate_up(wp), interleave_gate_up(bp), inter, activation)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_rows_do_not_depend_on_the_batch():
    wp, bp = _case(128, 64, True)
    wi, bi = interleave_gate_up(wp), interleave_gate_up(bp)
    x = torch.randn(900, 64, generator=G).bfloat16()
    full = gated_gemm(x, wi, bi, 128, "silu")
    for rows in (1, 5, 16, 17, 33, 767, 768, 899):
        assert torch.equal(gated_gemm(x[:rows], wi, bi, 128, "silu"), full[:rows]), rows
    perm = torch.randperm(900, generator=G)
    assert torch.equal(gated_gemm(x[perm], wi, bi, 128, "silu"), full[perm])


def test_interleaving_is_a_reorder_of_whole_blocks():
    wp, bp = _case(48, 32, True)  # 3 gate blocks, 3 up blocks
    wi, bi = interleave_gate_up(wp), interleave_gate_up(bp)
    assert [torch.equal(wi[i], wp[j]) for i, j in enumerate((0, 3, 1, 4, 2, 5))] == [True] * 6
    assert torch.equal(bi.view(6, 16)[1], bp.view(6, 16)[3])
    with pytest.raises(ValueError, match="whole column blocks"):
        interleave_gate_up(pack_amx(torch.randn(48, 32)))


def test_rejects_bad_input():
    wp, _ = _case(64, 64, False)
    wi = interleave_gate_up(wp)
    x = torch.randn(3, 64).bfloat16()
    with pytest.raises(RuntimeError, match="silu or gelu_tanh"):
        gated_gemm(x, wi, None, 64, "relu")
    with pytest.raises(RuntimeError, match="twice as many"):
        gated_gemm(x, wi, None, 32, "silu")
    with pytest.raises(RuntimeError, match="columns"):
        gated_gemm(torch.randn(3, 96).bfloat16(), wi, None, 64, "silu")
