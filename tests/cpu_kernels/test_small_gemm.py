"""The native small_gemm (decode-sized fp32 matmuls on a panel-packed weight) and the Linear that
picks between it and oneDNN by row count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bulkrun.model.linear import PANEL, SMALL_ROWS, Linear, pack_panels

G = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, generator=G)


def small_gemm(x, weight, bias=None):
    panels = pack_panels(weight)
    padded_bias = None
    if bias is not None:
        padded_bias = torch.zeros(panels.shape[0] * PANEL)
        padded_bias[: weight.shape[0]] = bias
    y = torch.full((x.shape[0], weight.shape[0]), float("nan"))
    torch.ops.bulkrun_cpu.small_gemm(x, panels, padded_bias, y)
    return y


@pytest.mark.parametrize("rows", [1, 3, 11, 12, 13, 48, 100])
@pytest.mark.parametrize(("n", "k"), [(32, 16), (960, 576), (45, 7), (576, 1536), (97, 64)])
def test_matches_f_linear(rows, n, k):
    x, w = randn(rows, k), randn(n, k)
    torch.testing.assert_close(small_gemm(x, w), F.linear(x, w), rtol=1e-5, atol=1e-4)


def test_bias_and_strided_rows():
    base = randn(20, 200)
    x = base[:, 8:136]  # rows 200 floats apart, 128 wide
    w, b = randn(70, 128), randn(70)
    torch.testing.assert_close(small_gemm(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-4)


def test_writes_only_its_columns_of_a_wider_output():
    x, w = randn(5, 64), randn(40, 64)  # 40 columns: the second panel is mostly padding
    out = torch.full((5, 48), 7.0)
    torch.ops.bulkrun_cpu.small_gemm(x, pack_panels(w), None, out[:, :40])
    torch.testing.assert_close(out[:, :40], F.linear(x, w), rtol=1e-5, atol=1e-4)
    assert torch.equal(out[:, 40:], torch.full((5, 8), 7.0))


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
