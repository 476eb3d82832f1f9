"""Every Linear packing the engine uses gives each row the same bits whatever the row count (the
bf16 oneDNN default does not: its K = 1536 blocking changes with M)."""

from __future__ import annotations

import pytest
import torch

from bulkrun.model.linear import Linear, onednn_bf16_available, pack_linears_for_cpu, set_batch_invariant
from bulkrun_kernels import cpu_build
from bulkrun_kernels.cpu_gemm import fixed_order_bf16_kernel

G = torch.Generator().manual_seed(0)
NATIVE = cpu_build.compiler_available() and cpu_build.load()


def _layer(n, k, dtype, **pack):
    layer = Linear(k, n, bias=True)
    layer.weight.data = torch.randn(n, k, generator=G).to(dtype)
    layer.bias.data = torch.randn(n, generator=G).to(dtype)
    layer.pack_for_cpu(**pack)
    return layer


PACKINGS = [
    pytest.param(
        torch.bfloat16, {"onednn": True}, id="bf16-onednn-tiles",
        marks=pytest.mark.skipif(not onednn_bf16_available(), reason="oneDNN has no bf16 path here"),
    ),
    pytest.param(torch.bfloat16, {"onednn": True, "upcast": True}, id="bf16-upcast-onednn-tiles"),
    pytest.param(
        torch.bfloat16, {"panels": True, "onednn": False, "upcast": True}, id="bf16-upcast-panels",
        marks=pytest.mark.skipif(not NATIVE, reason="no native kernels"),
    ),
    pytest.param(torch.float32, {"onednn": True}, id="fp32-onednn-tiles"),
    pytest.param(
        torch.float32, {"panels": True, "onednn": True}, id="fp32-panels",
        marks=pytest.mark.skipif(not NATIVE, reason="no native kernels"),
    ),
    pytest.param(  # AMX tiles, or AVX512-BF16 dot products where there is no AMX
        torch.bfloat16, {"fixed_order": fixed_order_bf16_kernel()}, id="bf16-fixed-order",
        marks=pytest.mark.skipif(not (NATIVE and fixed_order_bf16_kernel()), reason="no AMX nor AVX512-BF16"),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("dtype", "pack"), PACKINGS)
@pytest.mark.parametrize(("n", "k"), [(576, 1536), (960, 576)])
def test_row_bits_independent_of_row_count(dtype, pack, n, k):
    layer = _layer(n, k, dtype, **pack)
    x = torch.randn(300, k, generator=G).to(dtype)
    full = layer(x)
    for rows in (1, 3, 8, 48, 64, 65, 128, 129, 200):
        assert torch.equal(layer(x[:rows]), full[:rows]), rows
    perm = torch.randperm(300, generator=G)
    assert torch.equal(layer(x[perm]), full[perm])


def test_not_invariant_calls_onednn_on_the_whole_batch():
    layer = _layer(576, 1536, torch.float32, onednn=True)
    set_batch_invariant(torch.nn.Sequential(layer), False)
    x = torch.randn(200, 1536, generator=G)
    direct = torch.ops.mkldnn._linear_pointwise(x, layer.packed, layer.bias, "none", [], "")
    assert torch.equal(layer(x), direct)


@pytest.mark.skipif(not (NATIVE and fixed_order_bf16_kernel()), reason="no AMX nor AVX512-BF16")
def test_not_invariant_bf16_runs_the_fixed_order_kernel_on_decode_sized_steps_only():
    from bulkrun.model.linear import SMALL_ROWS
    from bulkrun_kernels.cpu_gemm import bf16_gemm

    layer = Linear(576, 960, bias=True)
    layer.weight.data = torch.randn(960, 576, generator=G).bfloat16()
    layer.bias.data = torch.randn(960, generator=G).bfloat16()
    set_batch_invariant(torch.nn.Sequential(layer), False)
    layer.pack_for_cpu(fixed_order=fixed_order_bf16_kernel(), onednn=True)
    assert layer.tiles is not None and layer.packed is not None
    small = torch.randn(SMALL_ROWS, 576, generator=G).bfloat16()
    large = torch.randn(SMALL_ROWS + 72, 576, generator=G).bfloat16()
    tiles = bf16_gemm(small, layer.tiles, layer.tile_bias, 960, kernel=layer.tile_kernel)
    assert torch.equal(layer(small), tiles)
    onednn = torch.ops.mkldnn._linear_pointwise(large, layer.packed, layer.bias, "none", [], "")
    assert torch.equal(layer(large), onednn)


@pytest.mark.parametrize("invariant", [True, False])
def test_without_onednn_bf16_a_bf16_layer_computes_in_fp32(monkeypatch, invariant):
    """AVX2 CPUs: oneDNN refuses bf16 weights, so packing keeps an fp32 copy; the layer still takes
    and returns bf16 (what the model around it holds) and equals the fp32 product rounded once."""
    monkeypatch.setattr("bulkrun.model.linear.onednn_bf16_available", lambda: False)
    layer = Linear(576, 960, bias=True)
    layer.weight.data = torch.randn(960, 576, generator=G).bfloat16()
    layer.bias.data = torch.randn(960, generator=G).bfloat16()
    expected_weight, expected_bias = layer.weight.data.float(), layer.bias.data.float()
    model = torch.nn.Sequential(layer)
    set_batch_invariant(model, invariant)
    assert pack_linears_for_cpu(model, panels=NATIVE)
    assert layer.io_dtype == torch.bfloat16 and layer.dtype == torch.bfloat16
    assert (layer.packed if layer.packed is not None else layer.panels).dtype == torch.float32
    x = torch.randn(70, 576, generator=G).bfloat16()
    got = layer(x)
    assert got.dtype == torch.bfloat16
    expected = torch.nn.functional.linear(x.float(), expected_weight, expected_bias)
    torch.testing.assert_close(got.float(), expected, atol=0.05, rtol=0.01)
    if invariant:
        assert torch.equal(layer(x[:1]), got[:1]) and torch.equal(layer(x[:9]), got[:9])


@pytest.mark.skipif(not NATIVE, reason="no native kernels")
@pytest.mark.parametrize("invariant", [True, False])
def test_an_avx2_cpu_runs_invariant_fp32_layers_on_the_panel_kernel(monkeypatch, invariant):
    """Without AVX-512 the panel kernel has its AVX2 register tile: invariant fp32 layers stream
    each weight once per call there, instead of once per oneDNN row tile; not invariant, oneDNN
    alone (the panels were measured against it on AVX-512 only)."""
    monkeypatch.setattr("bulkrun.model.linear.has_avx512", lambda: False)
    monkeypatch.setattr("bulkrun.model.linear.cpu_flags", lambda: frozenset({"avx2", "fma", "sse4_2"}))
    layer = Linear(576, 960, bias=True)
    layer.weight.data = torch.randn(960, 576, generator=G)
    layer.bias.data = torch.randn(960, generator=G)
    model = torch.nn.Sequential(layer)
    set_batch_invariant(model, invariant)
    assert pack_linears_for_cpu(model, panels=True)
    assert (layer.panels is not None) == invariant
    assert (layer.packed is None) == invariant


def test_a_cpu_without_avx2_keeps_onednn_tiles(monkeypatch):
    monkeypatch.setattr("bulkrun.model.linear.has_avx512", lambda: False)
    monkeypatch.setattr("bulkrun.model.linear.cpu_flags", lambda: frozenset({"sse4_2", "avx"}))
    layer = Linear(64, 32, bias=False)
    layer.weight.data = torch.randn(32, 64, generator=G)
    assert pack_linears_for_cpu(torch.nn.Sequential(layer), panels=True)
    assert layer.panels is None and layer.packed is not None
