"""Rotary position embedding, rotate-half (NeoX/Llama) style, for q and k in one launch.

cos_sin_cache[row] holds cos in its first R/2 columns and sin in its last R/2 (R <= head_dim D); for
each head, x1 = x[:R/2], x2 = x[R/2:R] become (x1*cos - x2*sin, x2*cos + x1*sin), computed in fp32,
and x[R:] passes through (partial rotary, Phi-4-mini). `positions` holds each token's row.
One program per token rotates all its q and k heads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import (
    FLOAT_DTYPES,
    check_dtype,
    check_last_dim_contiguous,
    check_ndim,
    check_runnable,
    check_same_device,
)


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, t, stride_t, stride_h, stride_dt, stride_dh, cos, sin,
                  NUM_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HALF: tl.constexpr,
                  HALF_PAD: tl.constexpr, PASS: tl.constexpr, PASS_PAD: tl.constexpr):  # fmt: skip
    h = tl.arange(0, HEADS_PAD)[:, None]
    d = tl.arange(0, HALF_PAD)[None, :]
    mask = (h < NUM_HEADS) & (d < HALF)
    src = src_ptr + t * stride_t + h * stride_h + d
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = dst_ptr + t * stride_dt + h * stride_dh + d
    out_ty = dst_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos - x2 * sin).to(out_ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(out_ty), mask=mask)
    if PASS > 0:  # the dims past the rotation, copied as they are (a no-op in place)
        p = tl.arange(0, PASS_PAD)[None, :]
        keep = (h < NUM_HEADS) & (p < PASS)
        rest = tl.load(src_ptr + t * stride_t + h * stride_h + 2 * HALF + p, mask=keep, other=0.0)
        tl.store(dst_ptr + t * stride_dt + h * stride_dh + 2 * HALF + p, rest.to(out_ty), mask=keep)


@triton.jit
def _rotary_kernel(
    q_out_ptr,
    k_out_ptr,
    q_ptr,
    k_ptr,
    positions_ptr,
    cos_sin_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_qot,
    stride_qoh,
    stride_kot,
    stride_koh,
    stride_cs,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    Q_HEADS_PAD: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    PASS: tl.constexpr,
    PASS_PAD: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + t).to(tl.int64)
    d = tl.arange(0, HALF_PAD)[None, :]
    cos = tl.load(cos_sin_ptr + pos * stride_cs + d, mask=d < HALF, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + d, mask=d < HALF, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, q_out_ptr, t, stride_qt, stride_qh, stride_qot, stride_qoh, cos, sin,
                  NUM_Q_HEADS, Q_HEADS_PAD, HALF, HALF_PAD, PASS, PASS_PAD)  # fmt: skip
    _rotate_heads(k_ptr, k_out_ptr, t, stride_kt, stride_kh, stride_kot, stride_koh, cos, sin,
                  NUM_KV_HEADS, KV_HEADS_PAD, HALF, HALF_PAD, PASS, PASS_PAD)  # fmt: skip


def _check_args(q, k, positions, cos_sin_cache, q_out, k_out) -> None:
    check_ndim("q", q, 3, "[num_tokens, num_q_heads, head_dim]")
    check_ndim("k", k, 3, "[num_tokens, num_kv_heads, head_dim]")
    check_ndim("positions", positions, 1, "[num_tokens]")
    check_ndim("cos_sin_cache", cos_sin_cache, 2, "[rows, rotary_dim]")
    for name, t in (("q", q), ("k", k), ("cos_sin_cache", cos_sin_cache)):
        check_dtype(name, t, FLOAT_DTYPES)
        check_last_dim_contiguous(name, t)
    check_dtype("positions", positions, (torch.int64, torch.int32))
    head_dim = q.shape[2]
    if k.shape[2] != head_dim or k.shape[0] != q.shape[0] or positions.shape[0] != q.shape[0]:
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)} and positions {tuple(positions.shape)} disagree "
            "on num_tokens or head_dim"
        )
    rotary_dim = cos_sin_cache.shape[1]
    if rotary_dim > head_dim or rotary_dim % 2 or rotary_dim == 0:
        raise ValueError(
            f"cos_sin_cache must have an even number of columns, at most head_dim={head_dim}, got {rotary_dim}"
        )
    named = {"q": q, "k": k, "positions": positions, "cos_sin_cache": cos_sin_cache}
    for name, t, like in (("q_out", q_out, q), ("k_out", k_out, k)):
        if t is None:
            continue
        if t.shape != like.shape or t.dtype != like.dtype or t.stride(-1) != 1:
            raise ValueError(
                f"{name} must match ({tuple(like.shape)}, {like.dtype}), got {tuple(t.shape)}, {t.dtype}"
            )
        named[name] = t
    check_same_device(**named)


def rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_out: torch.Tensor | None = None,
    k_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated (q, k) as new tensors; pass q_out=q, k_out=k to rotate in place (each program reads
    both halves of its token before writing them)."""
    _check_args(q, k, positions, cos_sin_cache, q_out, k_out)
    check_runnable(_rotary_kernel, q.device)
    q_out = torch.empty_like(q) if q_out is None else q_out
    k_out = torch.empty_like(k) if k_out is None else k_out
    num_tokens, num_q_heads, head_dim = q.shape
    if num_tokens == 0:
        return q_out, k_out
    num_kv_heads = k.shape[1]
    half, rest = cos_sin_cache.shape[1] // 2, head_dim - cos_sin_cache.shape[1]
    _rotary_kernel[(num_tokens,)](
        q_out, k_out, q, k, positions, cos_sin_cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        cos_sin_cache.stride(0),
        NUM_Q_HEADS=num_q_heads,
        NUM_KV_HEADS=num_kv_heads,
        Q_HEADS_PAD=triton.next_power_of_2(num_q_heads),
        KV_HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HALF=half,
        HALF_PAD=triton.next_power_of_2(half),
        PASS=rest,
        PASS_PAD=triton.next_power_of_2(max(rest, 1)),
    )  # fmt: skip
    return q_out, k_out
