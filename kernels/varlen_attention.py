"""Triton bidirectional attention over packed whole sequences (the encoder's attention on the GPU).

One program per (query block, sequence, head): it walks its sequence's keys in blocks with the online
softmax (fp32 running max and sum), so no [L, L] score matrix is ever stored. Keys past the sequence's
end are masked; query blocks past it do nothing. Layout as in varlen_attention_ref.py, which it equals.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import FLOAT_DTYPES, check_dtype, check_ndim, check_runnable, check_same_device


@triton.jit(do_not_specialize=["scale"])
def _varlen_attention_kernel(
    out_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    cu_seqlens_ptr,
    scale,
    stride_t,  # q, k and v share [T, H, D] strides (the wrapper sees to it); out is contiguous
    stride_h,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    block_m, seq, head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start = tl.load(cu_seqlens_ptr + seq).to(tl.int64)
    length = (tl.load(cu_seqlens_ptr + seq + 1) - tl.load(cu_seqlens_ptr + seq)).to(tl.int64)
    if block_m * BLOCK_M >= length:
        return
    rows = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < length
    dim_ok = dims < HEAD_DIM
    base = start * stride_t + head * stride_h
    q = tl.load(q_ptr + base + rows[:, None] * stride_t + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :],
                other=0.0)  # fmt: skip
    if DOT_IN_FP32:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for key_start in range(0, length, BLOCK_N):
        keys = key_start + tl.arange(0, BLOCK_N)
        key_ok = keys < length
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + base + keys[:, None] * stride_t + dims[None, :], mask=kv_mask, other=0.0)
        if DOT_IN_FP32:
            k = k.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
        scores = tl.where(key_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + base + keys[:, None] * stride_t + dims[None, :], mask=kv_mask, other=0.0)
        if DOT_IN_FP32:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    acc = acc / l_i[:, None]
    out_base = start * stride_ot + head * stride_oh
    tl.store(out_ptr + out_base + rows[:, None] * stride_ot + dims[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok[None, :])  # fmt: skip


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """out [T, H, D] of q, k, v [T, H, D] over the sequences cu_seqlens [B + 1] (int32) delimits.
    `max_seqlen` sizes the grid; without it the lengths are read from the host (one sync)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_ndim(name, t, 3, "[num_tokens, heads, head_dim]")
        check_dtype(name, t, FLOAT_DTYPES)
    if k.shape != q.shape or v.shape != q.shape or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share shape and dtype, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")  # fmt: skip
    check_ndim("cu_seqlens", cu_seqlens, 1, "[num_seqs + 1]")
    check_dtype("cu_seqlens", cu_seqlens, (torch.int32,))
    device = check_same_device(q=q, k=k, v=v, cu_seqlens=cu_seqlens)
    check_runnable(_varlen_attention_kernel, device)
    if not (q.stride() == k.stride() == v.stride()) or q.stride(-1) != 1:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty(q.shape, dtype=q.dtype, device=device)
    num_seqs = cu_seqlens.shape[0] - 1
    if q.shape[0] == 0 or num_seqs == 0:
        return out
    if max_seqlen is None:
        max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    head_dim = q.shape[2]
    block_m = 64 if max_seqlen > 32 else 16
    grid = (triton.cdiv(max_seqlen, block_m), num_seqs, q.shape[1])
    _varlen_attention_kernel[grid](
        out, q, k, v, cu_seqlens, scale, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=block_m, BLOCK_N=32,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        # Triton's interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584)
        DOT_IN_FP32=q.dtype == torch.bfloat16 and type(_varlen_attention_kernel).__name__ == "InterpretedFunction",
    )  # fmt: skip
    return out
