"""Write the step's new K/V rows into the paged cache through the slot mapping, in place.

slot = block * block_size + offset. A negative slot (padding of a CUDA-graph batch) is skipped.
One program per token stores all its kv heads for both K and V.
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
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    block_size,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot < 0:
        return
    block = slot // block_size
    offset = slot % block_size
    h = tl.arange(0, HEADS_PAD)[:, None]
    d = tl.arange(0, DIM_PAD)[None, :]
    mask = (h < NUM_HEADS) & (d < HEAD_DIM)
    t64 = t.to(tl.int64)
    k = tl.load(k_ptr + t64 * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(v_ptr + t64 * stride_vt + h * stride_vh + d, mask=mask)
    k_dst = k_cache_ptr + block * stride_kcb + offset * stride_kcs + h * stride_kch + d
    v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vcs + h * stride_vch + d
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _check_args(k, v, k_cache, v_cache, slot_mapping) -> None:
    check_ndim("k", k, 3, "[num_tokens, num_kv_heads, head_dim]")
    check_ndim("v", v, 3, "[num_tokens, num_kv_heads, head_dim]")
    check_ndim("k_cache", k_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    check_ndim("v_cache", v_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    check_ndim("slot_mapping", slot_mapping, 1, "[num_tokens]")
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_dtype(name, t, FLOAT_DTYPES)
        check_last_dim_contiguous(name, t)
    check_dtype("slot_mapping", slot_mapping, (torch.int64, torch.int32))
    if v.shape != k.shape:
        raise ValueError(f"v shape {tuple(v.shape)} differs from k shape {tuple(k.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} differs from k_cache {tuple(k_cache.shape)}")
    if k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(
            f"k heads/head_dim {tuple(k.shape[1:])} differ from the cache's {tuple(k_cache.shape[2:])}"
        )
    if slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} slots for {k.shape[0]} tokens")
    check_same_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """k_cache[slot // block_size, slot % block_size] = k[t] (same for v), for every t with slot >= 0."""
    _check_args(k, v, k_cache, v_cache, slot_mapping)
    check_runnable(_write_kv_kernel, k.device)
    num_tokens, num_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k_cache.shape[1],
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_HEADS=num_heads,
        HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_heads),
        DIM_PAD=triton.next_power_of_2(head_dim),
    )  # fmt: skip
