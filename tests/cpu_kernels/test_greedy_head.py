"""The screened greedy head (bf16 screen, int8 on AMX tiles or on AVX512-VNNI, exact check) against torch.argmax of the fp32 product:
random rows, rows built with 1-ulp gaps and exact ties (the lowest id must win), huge and tiny norms,
subnormal products, inf and NaN rows, outlier dimensions, one row and 64, vocabularies that are not a
multiple of 16, hidden sizes that are not a multiple of the int8 tiles' 64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bulkrun.model.greedy_head import ScreenedGreedyHead
from bulkrun_kernels.cpu_greedy import (
    Int8Head,
    VnniHead,
    int8_screen_available,
    row_norms,
    screened_argmax,
    screened_argmax_int8,
    screened_argmax_vnni,
    vnni_screen_available,
)

ONEDNN_BF16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
INT8 = int8_screen_available()
VNNI = vnni_screen_available()
INT8_PATHS = (["int8"] if INT8 else []) + (["vnni"] if VNNI else [])
PATHS = (["bf16", "torch"] if ONEDNN_BF16 else ["torch"]) + INT8_PATHS
ULP_UNITS = 2**24 - 64  # the best logit in units of 2^-10: the top fp32 binade, where 1 unit is 1 ulp


def greedy(h: torch.Tensor, w: torch.Tensor, path: str = PATHS[0]) -> torch.Tensor:
    """The production path (its bf16 product: oneDNN's, or dpbf16_gemm's without AMX), or the kernel
    on torch's bf16 product, or the int8 screen."""
    if path == "bf16":
        return ScreenedGreedyHead(w, int8=False)(h)
    if path == "int8":
        return screened_argmax_int8(h, Int8Head(w), w, row_norms(w))
    if path == "vnni":
        return screened_argmax_vnni(h, VnniHead(w), w, row_norms(w))
    return screened_argmax(F.linear(h.bfloat16(), w.bfloat16()), h, w, row_norms(w))


def fp32_argmax(h, w):
    return (h @ w.T).argmax(dim=-1)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows", [1, 64])
@pytest.mark.parametrize(("vocab", "hidden"), [(1000, 64), (49157, 576)])
def test_random_rows_match_the_fp32_argmax(path, rows, vocab, hidden):
    g = torch.Generator().manual_seed(rows + vocab)
    h = torch.randn(rows, hidden, generator=g) * 3
    w = torch.randn(vocab, hidden, generator=g) * 0.05
    got = greedy(h, w, path)
    assert got.dtype == torch.int64 and got.shape == (rows,)
    assert torch.equal(got, fp32_argmax(h, w))


def tie_weights(hidden: int, vocab: int, special: dict[int, int], seed: int = 0):
    """h [hidden] and w [vocab, hidden], all non-negative multiples of 2^-10 whose products and
    partial sums fp32 holds exactly (any summation order, any path). Row `id` in `special` has logit
    (ULP_UNITS + extra) units; every other row has a smaller one, many of them 1 to 3 ulps below."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randint(1, 4, (hidden,), generator=g)
    h[:3] = torch.tensor([1, 2, 2])
    base = torch.randint(0, 2**16, (hidden,), generator=g)
    base = base * (ULP_UNITS - 1000) // int((h * base).sum())
    base[0] += ULP_UNITS - int((h * base).sum())  # h[0] = 1: exactly ULP_UNITS units
    rows = base.repeat(vocab, 1)
    rows[:, 0] -= torch.randint(1, 4, (vocab,), generator=g)  # 1 to 3 ulps below the best
    far = torch.rand(vocab, generator=g) < 0.5
    rows[far] -= torch.randint(0, 2, (int(far.sum()), hidden), generator=g)
    rows.clamp_(min=0)
    for i, (token, extra) in enumerate(special.items()):
        rows[token] = base
        rows[token, 0] += extra
        rows[token, 1 + i % 2] += 1  # a distinct vector with the same logit: h[1] == h[2]
        rows[token, 2 - i % 2] -= 1
    return h.float(), rows.float() * 2**-10


TIE_CASES = {
    "one ulp above, higher id": ({10: 0, 700: 1}, 700),
    "one ulp above, lower id": ({10: 1, 700: 0}, 10),
    "exact tie of two": ({700: 1, 10: 1}, 10),
    "exact tie across 16-blocks and the tail": ({999: 2, 16: 2, 15: 2}, 15),
    "exact tie inside the tail": ({999: 1, 998: 1}, 998),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("hidden", [64, 576])
@pytest.mark.parametrize("w_scale", [0, 30, -40])
@pytest.mark.parametrize("case", list(TIE_CASES))
def test_one_ulp_gaps_and_exact_ties_pick_the_lowest_best_id(path, hidden, w_scale, case):
    special, want = TIE_CASES[case]
    h, w = tie_weights(hidden, 1000, special)
    w = w * 2.0**w_scale
    h = torch.stack([h, h * 2.0**40, h * 2.0**-50])  # huge and tiny norms, same exact ordering
    assert fp32_argmax(h, w).tolist() == [want] * 3  # the construction is exact in fp32
    assert greedy(h, w, path).tolist() == [want] * 3


@pytest.mark.parametrize("path", PATHS)
def test_a_bf16_rounding_that_reverses_the_order_is_caught(path):
    """h = (1, -1, 1, -1, ...): row 900's pairs (1 + 0.49 2^-7, 1) round to (1, 1) and score 0 in bf16,
    row 3's (1 + 0.51 2^-7, 1) on half the pairs round up and outscore it, though 900 is the best."""
    g = torch.Generator().manual_seed(5)
    pairs = 288
    h = torch.tensor([1.0, -1.0]).repeat(pairs)[None]
    w = torch.randn(1000, 2 * pairs, generator=g) * 0.01
    w[900] = torch.tensor([1 + 0.49 * 2**-7, 1.0]).repeat(pairs)
    w[3] = torch.tensor([1 + 0.51 * 2**-7, 1.0]).repeat(pairs)
    w[3, :pairs:2] = 1.0
    approx = F.linear(h.bfloat16(), w.bfloat16())[0]
    assert approx[3] > approx[900] and fp32_argmax(h, w).tolist() == [900]
    assert greedy(h, w, path).tolist() == [900]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("scale", [2.0**50, 2.0**-55])
def test_huge_and_tiny_norms(path, scale):
    g = torch.Generator().manual_seed(1)
    h = torch.randn(8, 64, generator=g) * scale
    w = torch.randn(1003, 64, generator=g) * scale
    assert torch.equal(greedy(h, w, path), fp32_argmax(h, w))


@pytest.mark.parametrize("path", PATHS)
def test_subnormal_products_still_give_the_exact_argmax(path):
    g = torch.Generator().manual_seed(2)
    h = torch.randn(8, 64, generator=g) * 2.0**-64
    w = torch.randn(1003, 64, generator=g) * 2.0**-64  # products near 2^-128: fp32 subnormals
    assert torch.equal(greedy(h, w, path), (h.double() @ w.double().T).argmax(dim=-1))


@pytest.mark.parametrize("path", INT8_PATHS)
@pytest.mark.parametrize(("rows", "hidden"), [(1, 576), (37, 100), (130, 576), (7, 30)])
def test_int8_screen_with_outlier_dimensions_and_ragged_shapes(path, rows, hidden):
    """Hidden rows with a few dimensions 40x the rest (as a model's final rows have) set a coarse int8
    step for one part; the second part (hi, lo) or the outliers in fp32 (VNNI) and the bound keep the
    token exact. Hidden sizes off the tiles' 64 and the VNNI quads' 4, row counts off their 16 and 6."""
    g = torch.Generator().manual_seed(rows)
    h = torch.randn(rows, hidden, generator=g)
    h[:, [3, hidden // 2]] *= 40
    w = torch.randn(4099, hidden, generator=g) * 0.05
    w[7] *= 30  # one row of a much larger scale than the others
    assert torch.equal(greedy(h, w, path), fp32_argmax(h, w))


@pytest.mark.skipif(not VNNI, reason="no AVX512-VNNI here")
def test_vnni_outliers_fixed_by_other_rows_leave_the_tokens_exact():
    """The outlier dimensions are fixed at the first rows screened; rows whose large dimensions lie
    elsewhere (another prompt, another model's channels) only screen more loosely."""
    g = torch.Generator().manual_seed(8)
    w = torch.randn(20000, 576, generator=g) * 0.05
    head, norms = VnniHead(w), row_norms(w)
    first = torch.randn(8, 576, generator=g)
    first[:, :16] *= 30
    assert torch.equal(screened_argmax_vnni(first, head, w, norms), fp32_argmax(first, w))
    assert head.dims.tolist() == list(range(16))
    later = torch.randn(64, 576, generator=g)
    later[:, 300:304] *= 60
    assert torch.equal(screened_argmax_vnni(later, head, w, norms), fp32_argmax(later, w))


@pytest.mark.parametrize("path", INT8_PATHS)
def test_an_int8_rounding_that_reverses_the_order_is_caught(path):
    """Row 900's values sit just below an int8 step boundary and row 3's just above: quantized, row 3
    outscores row 900, though 900 is the best in fp32."""
    hidden = 576
    h = torch.ones(1, hidden)
    w = torch.zeros(1000, hidden)
    w[:, 0] = 127.0  # every row's scale: 1 int8 step = 1.0
    w[900, 1:] = 0.49
    w[3, 1:] = 0.51
    w[3, 1::2] = 0.45
    head = Int8Head(w) if path == "int8" else VnniHead(w)  # the same scales
    approx_900 = head.scales[900] * torch.round(w[900] / head.scales[900]).sum()
    approx_3 = head.scales[3] * torch.round(w[3] / head.scales[3]).sum()
    assert approx_3 > approx_900 and fp32_argmax(h, w).tolist() == [900]
    assert greedy(h, w, path).tolist() == [900]


def test_rows_with_inf_or_nan_are_computed_in_full():
    g = torch.Generator().manual_seed(3)
    h = torch.randn(4, 64, generator=g)
    w = torch.randn(1003, 64, generator=g)
    h[1, 5], h[2, 7] = float("inf"), float("nan")
    approx = F.linear(h.bfloat16(), w.bfloat16())
    raw = torch.ops.bulkrun_cpu.greedy_head(approx, h, w, row_norms(w))
    assert raw[1] == -1 and raw[2] == -1 and (raw[[0, 3]] >= 0).all()
    assert torch.equal(greedy(h, w), fp32_argmax(h, w))
    if INT8:
        head = Int8Head(w)
        raw = torch.ops.bulkrun_cpu.greedy_head_int8(
            h, head.packed, head.scales, head.err_norms, head.max_scale, w, row_norms(w)
        )
        assert raw[1] == -1 and raw[2] == -1 and (raw[[0, 3]] >= 0).all()
        assert torch.equal(greedy(h, w, "int8"), fp32_argmax(h, w))
    if VNNI:
        raw = vnni_raw(h, w)
        assert raw[1] == -1 and raw[2] == -1 and (raw[[0, 3]] >= 0).all()
        assert torch.equal(greedy(h, w, "vnni"), fp32_argmax(h, w))


def test_row_norms_never_fall_below_the_true_norms():
    w = torch.randn(5000, 64, generator=torch.Generator().manual_seed(4))
    assert (row_norms(w).double() >= w.double().norm(dim=1)).all()


def test_rows_of_near_equal_logits_everywhere_are_computed_in_full():
    g = torch.Generator().manual_seed(6)
    w = torch.randn(1, 64, generator=g).repeat(5000, 1)  # every token ties: the lowest id wins
    h = torch.randn(3, 64, generator=g)
    h[1] = 0.0  # every logit 0
    approx = F.linear(h.bfloat16(), w.bfloat16())
    assert torch.ops.bulkrun_cpu.greedy_head(approx, h, w, row_norms(w)).tolist() == [-1, -1, -1]
    assert greedy(h, w).tolist() == fp32_argmax(h, w).tolist() == [0, 0, 0]
    if INT8:
        head = Int8Head(w)
        raw = torch.ops.bulkrun_cpu.greedy_head_int8(
            h, head.packed, head.scales, head.err_norms, head.max_scale, w, row_norms(w)
        )
        assert raw.tolist() == [-1, -1, -1]
        assert greedy(h, w, "int8").tolist() == [0, 0, 0]
    if VNNI:
        assert vnni_raw(h, w).tolist() == [-1, -1, -1]
        assert greedy(h, w, "vnni").tolist() == [0, 0, 0]


def vnni_raw(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The native VNNI op's tokens (-1: rows left to the caller)."""
    head = VnniHead(w)
    dims, w_out = head.outlier_weights(h)
    return torch.ops.bulkrun_cpu.greedy_head_vnni(
        h,
        head.packed,
        head.scales,
        head.err_norms,
        head.rowsums,
        head.max_scale,
        dims,
        w_out,
        w,
        row_norms(w),
    )


@pytest.mark.skipif(not ONEDNN_BF16, reason="oneDNN has no bf16 here")
def test_the_heads_bf16_product_stays_inside_the_bound():
    """The bound's premises (round-to-nearest inputs, fp32 accumulation, one output rounding) hold
    for the product the head really uses (oneDNN's, or dpbf16_gemm's without AMX): every entry within
    c2 |approx| + c1 ||h|| ||w_j||."""
    g = torch.Generator().manual_seed(7)
    h = torch.randn(48, 576, generator=g) * torch.logspace(-3, 3, 48)[:, None]
    w = torch.randn(4099, 576, generator=g) * 0.05
    head = ScreenedGreedyHead(w, int8=False)
    approx = head.screen(h).double()
    exact = h.double() @ w.double().T
    u, k = 2.0**-8, h.shape[1]
    c1 = 2 * u + u * u + 2 * k * 2.0**-24
    bound = 2.0**-7 * approx.abs() + c1 * h.double().norm(dim=1)[:, None] * w.double().norm(dim=1)[None]
    assert ((approx - exact).abs() <= bound).all()
