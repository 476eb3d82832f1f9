"""The native small_gemm (decode-sized fp32 matmuls on a panel-packed weight) and the Linear that
picks between it and oneDNN by row count. small_gemm_halves is the same product on the register
tile AVX2 CPUs run (two 16-column halves a panel), callable on any CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bulkrun.model.linear import PANEL, SMALL_ROWS, Linear, pack_panels

G = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, generator=G)


KERNELS = ["small_gemm", "small_gemm_halves"]


def small_gemm(x, weight, bias=None, kernel="small_gemm"):
    panels = pack_panels(weight)
    padded_bias = None
    if bias is not None:
        padded_bias = torch.zeros(panels.shape[0] * PANEL)
        padded_bias[: weight.shape[0]] = bias
    y = torch.full((x.shape[0], weight.shape[0]), float("nan"))
    getattr(torch.ops.bulkrun_cpu, kernel)(x, panels, padded_bias, y)
    return y


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("rows", [1, 3, 5, 6, 7, 11, 12, 13, 48, 100])
@pytest.mark.parametrize(("n", "k"), [(32, 16), (960, 576), (45, 7), (576, 1536), (97, 64), (8, 3)])
def test_matches_f_linear(kernel, rows, n, k):
    x, w = randn(rows, k), randn(n, k)
    # one fp32 chain of k products against MKL's blocked sums: the difference grows with k
    torch.testing.assert_close(
        small_gemm(x, w, kernel=kernel), F.linear(x, w), rtol=1e-5, atol=1e-5 + 1e-7 * k
    )


@pytest.mark.parametrize("rows", [1, 7, 13, 48])
def test_both_tiles_compute_the_same_chains(rows):
    """Each output is one FMA chain over k in order on either tile: the same bits."""
    x, w, b = randn(rows, 576), randn(200, 576), randn(200)
    assert torch.equal(small_gemm(x, w, b, "small_gemm"), small_gemm(x, w, b, "small_gemm_halves"))


@pytest.mark.parametrize("kernel", KERNELS)
def test_bias_and_strided_rows(kernel):
    base = randn(20, 200)
    x = base[:, 8:136]  # rows 200 floats apart, 128 wide
    w, b = randn(70, 128), randn(70)
    torch.testing.assert_close(small_gemm(x, w, b, kernel), F.linear(x, w, b), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n", [40, 20, 48])  # the last panel: 8 of 32 columns, 20 (half and 4), 16
def test_writes_only_its_columns_of_a_wider_output(kernel, n):
    x, w = randn(5, 64), randn(n, 64)
    out = torch.full((5, n + 8), 7.0)
    getattr(torch.ops.bulkrun_cpu, kernel)(x, pack_panels(w), None, out[:, :n])
    torch.testing.assert_close(out[:, :n], F.linear(x, w), rtol=1e-5, atol=1e-4)
    assert torch.equal(out[:, n:], torch.full((5, 8), 7.0))


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_row_has_the_same_bits_in_any_call(kernel):
    x, w, b = randn(50, 576), randn(100, 576), randn(100)
    full = small_gemm(x, w, b, kernel)
    for rows in (1, 2, 5, 6, 7, 12, 13, 49):
        assert torch.equal(small_gemm(x[:rows], w, b, kernel), full[:rows]), rows
        assert torch.equal(small_gemm(x[-rows:], w, b, kernel), full[-rows:]), rows


@pytest.mark.parametrize(
    ("x", "weight", "match"),
    [
        (torch.zeros(2, 8), torch.zeros(32, 16), "columns"),
        (torch.zeros(2, 8, dtype=torch.float64), torch.zeros(32, 8), "float32"),
    ],
)
def test_refuses_mismatched_inputs(x, weight, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops.bulkrun_cpu.small_gemm(x, pack_panels(weight.float()), None, torch.empty(2, 32))


@pytest.mark.parametrize("both", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_picks_by_row_count_with_the_same_results(both, bias):
    layer = Linear(96, 80, bias)
    layer.weight.data.copy_(randn(80, 96))
    if bias:
        layer.bias.data.copy_(randn(80))
    weight, b = layer.weight.detach().clone(), layer.bias.detach().clone() if bias else None
    layer.pack_for_cpu(panels=True, onednn=both)
    for rows in (1, 7, SMALL_ROWS, SMALL_ROWS + 1, 300):
        x = randn(rows, 96)
        torch.testing.assert_close(layer(x), F.linear(x, weight, b), rtol=1e-5, atol=1e-4)
