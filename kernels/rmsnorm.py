"""RMSNorm with the residual add fused in: one read of x and residual, one write of each result.

new_residual = x + residual (rounded to x's dtype, as an unfused model would hold it);
out = rmsnorm(new_residual) * weight, the norm computed in fp32. Each program normalises a few rows
(enough to fill ~4096 elements), so short rows such as per-head q/k norms do not waste programs.
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


@triton.jit(do_not_specialize=["num_rows"])  # token count varies every step: one compile, not many
def _rms_norm_kernel(
    out_ptr,
    residual_out_ptr,
    x_ptr,
    residual_ptr,
    weight_ptr,
    eps,
    num_rows,
    hidden,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    HAS_RESIDUAL: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    cols = tl.arange(0, BLOCK_H)[None, :]
    mask = (rows < num_rows) & (cols < hidden)
    x = tl.load(x_ptr + rows * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + rows * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + rows * stride_ro + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, axis=1) / hidden + eps)[:, None]
    normed = (xf * inv_rms).to(x_ptr.dtype.element_ty)  # round like the unfused model does
    w = tl.load(weight_ptr + cols, mask=cols < hidden, other=0.0)
    out = normed.to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + rows * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _check_args(x, weight, residual, out, residual_out) -> None:
    check_ndim("x", x, 2, "[num_tokens, hidden]")
    check_ndim("weight", weight, 1, "[hidden]")
    check_dtype("x", x, FLOAT_DTYPES)
    check_dtype("weight", weight, FLOAT_DTYPES)
    if weight.shape[0] != x.shape[1]:
        raise ValueError(f"weight has {weight.shape[0]} elements for hidden size {x.shape[1]}")
    if residual is None and residual_out is not None:
        raise ValueError("residual_out needs a residual (without one, the new residual is x itself)")
    named = {"x": x, "weight": weight}
    for name, t in (("residual", residual), ("out", out), ("residual_out", residual_out)):
        if t is None:
            continue
        if t.shape != x.shape or t.dtype != x.dtype:
            raise ValueError(
                f"{name} must match x ({tuple(x.shape)}, {x.dtype}), got {tuple(t.shape)}, {t.dtype}"
            )
        named[name] = t
    for name, t in named.items():
        check_last_dim_contiguous(name, t)
    check_same_device(**named)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(x + residual) * weight, x + residual); with residual None the second result is x itself.

    `out` / `residual_out` receive the results when given (residual_out may be `residual` itself).
    """
    _check_args(x, weight, residual, out, residual_out)
    check_runnable(_rms_norm_kernel, x.device)
    num_tokens, hidden = x.shape
    out = torch.empty_like(x) if out is None else out
    if residual is None:
        new_residual = x
    else:
        new_residual = torch.empty_like(x) if residual_out is None else residual_out
    if num_tokens == 0:
        return out, new_residual
    block_h = triton.next_power_of_2(hidden)
    rows = max(1, min(64, 4096 // block_h))  # short rows (per-head q/k norms) share a program
    _rms_norm_kernel[(triton.cdiv(num_tokens, rows),)](
        out, new_residual, x, x if residual is None else residual, weight, eps, num_tokens, hidden,
        x.stride(0), new_residual.stride(0) if residual is None else residual.stride(0),
        out.stride(0), new_residual.stride(0),
        HAS_RESIDUAL=residual is not None,
        ROWS=rows,
        BLOCK_H=block_h,
        num_warps=min(16, max(1, rows * block_h // 256)),
    )  # fmt: skip
    return out, new_residual
