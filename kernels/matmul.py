"""y = x @ W^T (+ bias) with tiles fixed by the weight alone: the batch-invariant linear on CUDA.

cuBLAS (and any autotuned matmul) picks its kernel, its tiling and whether to split K from the row
count M, so a row's bits change with how many rows share the step. Here the tile sizes are
constants, K is reduced in BLOCK_K steps in order inside one program (never split across programs),
and a persistent grid of at most one program per SM walks the output tiles: each output row is the
same sequence of tl.dot steps whatever M is (thinking-machines' batch_invariant_ops and vLLM's
batch-invariant mode do the same). The accumulator is fp32; the output is rounded once.
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

BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 64  # fixed: never chosen from M


@triton.jit(do_not_specialize=["M"])  # the row count varies every step: one compile
def _matmul_kernel(
    y_ptr,
    x_ptr,
    w_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_x,
    stride_w,
    stride_y,
    NUM_PROGRAMS,
    HAS_BIAS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    tiles_n = tl.cdiv(N, BN)
    tiles = tl.cdiv(M, BM) * tiles_n
    offs_k = tl.arange(0, BK)
    for tile in range(tl.program_id(0), tiles, NUM_PROGRAMS):
        rows = ((tile // tiles_n) * BM + tl.arange(0, BM)).to(tl.int64)
        cols = ((tile % tiles_n) * BN + tl.arange(0, BN)).to(tl.int64)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            ks = k0 + offs_k
            a = tl.load(
                x_ptr + rows[:, None] * stride_x + ks[None, :],
                mask=(rows[:, None] < M) & (ks[None, :] < K),
                other=0.0,
            )
            b = tl.load(
                w_ptr + cols[None, :] * stride_w + ks[:, None],
                mask=(cols[None, :] < N) & (ks[:, None] < K),
                other=0.0,
            )
            if DOT_IN_FP32:  # bf16 products are exact in fp32
                a, b = a.to(tl.float32), b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T (+ bias [N]) -> [M, N] in x's dtype, batch invariant."""
    check_ndim("x", x, 2, "[rows, in_features]")
    check_ndim("weight", weight, 2, "[out_features, in_features]")
    check_dtype("x", x, FLOAT_DTYPES)
    if weight.dtype != x.dtype:
        raise ValueError(f"weight must have x's dtype {x.dtype}, got {weight.dtype}")
    if weight.shape[1] != x.shape[1]:
        raise ValueError(f"x has {x.shape[1]} columns, the weight {weight.shape[1]}")
    named = {"x": x, "weight": weight}
    if bias is not None:
        check_ndim("bias", bias, 1, "[out_features]")
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias has {bias.shape[0]} elements for {weight.shape[0]} outputs")
        named["bias"] = bias
    for name, t in named.items():
        check_last_dim_contiguous(name, t)
    device = check_same_device(**named)
    check_runnable(_matmul_kernel, device)
    (m, k), n = x.shape, weight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=device)
    if m == 0:
        return y
    tiles = triton.cdiv(m, BLOCK_M) * triton.cdiv(n, BLOCK_N)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    programs = min(tiles, sms)
    _matmul_kernel[(programs,)](
        y, x, weight, weight if bias is None else bias, m, n, k,
        x.stride(0), weight.stride(0), y.stride(0), programs,
        HAS_BIAS=bias is not None,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        # Triton's interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584)
        DOT_IN_FP32=x.dtype != torch.float32 and type(_matmul_kernel).__name__ == "InterpretedFunction",
        BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K,
    )  # fmt: skip
    return y
