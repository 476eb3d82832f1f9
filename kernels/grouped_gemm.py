"""Grouped GEMM for the fused mixture-of-experts path: C[r] = A[r] @ W[e].T for every row r in expert
e's run offsets[e]:offsets[e + 1] of the expert-sorted rows (moe_routing.sort_by_expert).

One program per (row block of one expert, column block). The grid comes from shapes only (N // BLOCK_M
+ E: an upper bound on the row blocks of all experts, as in paged_attention) and each program finds its
expert by binary search over the offsets, so there is no host sync and an empty expert costs nothing
but a program that exits at once. fused_moe() chains gate_up, the gated activation and down.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import FLOAT_DTYPES, check_dtype, check_ndim, check_runnable, check_same_device
from .activation import gelu_tanh_and_mul, silu_and_mul
from .moe_routing import clamped_swiglu, combine, expert_biases, sort_by_expert

# Expert e owns row blocks from offsets[e] // BLOCK_M + e on, as sequence s owns query blocks from
# query_start_loc[s] // BLOCK_Q + s in paged attention: the same binary search finds the owner
from .paged_attention import _find_seq_idx as _find_expert  # noqa: E402


@triton.jit(do_not_specialize=["num_experts"])
def _grouped_gemm_kernel(
    c_ptr, a_ptr, w_ptr, offsets_ptr, num_experts, n_out, k_in,
    stride_am, stride_cm, stride_we, stride_wn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    block_idx = tl.program_id(0)
    expert = _find_expert(offsets_ptr, block_idx, num_experts, BLOCK_M)
    start = tl.load(offsets_ptr + expert)
    end = tl.load(offsets_ptr + expert + 1)
    local = block_idx - (start // BLOCK_M + expert)
    row0 = start + local * BLOCK_M
    if row0 >= end:
        return  # surplus program of the upper-bound grid (or an empty expert)
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < end, cols < n_out
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    for k0 in range(0, k_in, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_in
        a = tl.load(a_ptr + rows.to(tl.int64)[:, None] * stride_am + ks[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # fmt: skip
        w = tl.load(w_base + cols.to(tl.int64)[None, :] * stride_wn + ks[:, None],
                    mask=col_ok[None, :] & k_ok[:, None], other=0.0)  # fmt: skip
        acc += tl.dot(a.to(tl.float32), w.to(tl.float32), input_precision=DOT_PRECISION)
    c_offs = rows.to(tl.int64)[:, None] * stride_cm + cols[None, :]
    tl.store(c_ptr + c_offs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def grouped_gemm(a: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """a [N, K] rows sorted by expert, w [E, N_out, K], offsets [E + 1] int32 -> [N, N_out]."""
    check_ndim("a", a, 2, "[rows, in_features]")
    check_ndim("w", w, 3, "[num_experts, out_features, in_features]")
    check_dtype("a", a, FLOAT_DTYPES)
    check_dtype("offsets", offsets, (torch.int32,))
    if w.shape[2] != a.shape[1] or offsets.shape != (w.shape[0] + 1,):
        raise ValueError(
            f"shapes disagree: a {tuple(a.shape)}, w {tuple(w.shape)}, offsets {tuple(offsets.shape)}"
        )
    a, w = a.contiguous(), w.contiguous()
    check_same_device(a=a, w=w, offsets=offsets)
    check_runnable(_grouped_gemm_kernel, a.device)
    num_rows, num_experts, n_out = a.shape[0], w.shape[0], w.shape[1]
    c = torch.empty(num_rows, n_out, dtype=a.dtype, device=a.device)
    if num_rows == 0:
        return c
    block_m, block_n, block_k = 32, 64, 32
    grid = (num_rows // block_m + num_experts, triton.cdiv(n_out, block_n))
    _grouped_gemm_kernel[grid](
        c, a, w, offsets, num_experts, n_out, a.shape[1], a.stride(0), c.stride(0), w.stride(0), w.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
    )  # fmt: skip
    return c


def fused_moe(x, w_gate_up, w_down, topk_ids, topk_weights, activation: str = "silu", *, b_gate_up=None,
              b_down=None, swiglu=None):  # fmt: skip
    """reference.fused_moe on the GPU: the same sort and combine, both GEMMs grouped on the device,
    nothing read back to the host (capture-safe)."""
    num_experts, k = w_gate_up.shape[0], topk_ids.shape[1]
    order, counts, offsets = sort_by_expert(topk_ids, num_experts)
    rows = x.index_select(0, order // k)
    act = gelu_tanh_and_mul if activation == "gelu_tanh" else silu_and_mul
    if swiglu is not None:
        act = lambda h: clamped_swiglu(h, *swiglu)  # noqa: E731
    h = grouped_gemm(rows, w_gate_up, offsets)
    if b_gate_up is not None:
        h = h + expert_biases(b_gate_up, topk_ids, order)
    y = grouped_gemm(act(h), w_down, offsets)
    if b_down is not None:
        y = y + expert_biases(b_down, topk_ids, order)
    return combine(y, order, topk_weights, x.dtype), counts
