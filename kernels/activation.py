"""Fused gated activations for the MLP: out = act(x[:, :I]) * x[:, I:], one read, one write.

act is SiLU (SwiGLU: Llama, Qwen, Mistral) or GELU with the tanh approximation (GeGLU: Gemma).
Unfused, torch runs the activation, a slice copy and a multiply (three passes over [T, I]); this is one.
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
def _gated_activation_kernel(
    out_ptr, x_ptr, inter, stride_x, stride_o, BLOCK: tl.constexpr, GELU: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    if GELU:  # 0.5 g (1 + tanh(y)) = g * sigmoid(2 y), y = sqrt(2 / pi) (g + 0.044715 g^3)
        y = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = gate * tl.sigmoid(2.0 * y)
    else:
        act = gate * tl.sigmoid(gate)
    tl.store(out_ptr + row * stride_o + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x[T, 2I] (gate then up, as a fused gate_up projection yields) -> silu(gate) * up, [T, I]."""
    return _gated_activation(x, out, gelu=False)


def gelu_tanh_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x[T, 2I] (gate then up) -> gelu_tanh(gate) * up, [T, I] (GeGLU)."""
    return _gated_activation(x, out, gelu=True)


def _gated_activation(x: torch.Tensor, out: torch.Tensor | None, gelu: bool) -> torch.Tensor:
    check_ndim("x", x, 2, "[num_tokens, 2 * intermediate]")
    check_dtype("x", x, FLOAT_DTYPES)
    check_last_dim_contiguous("x", x)
    if x.shape[1] % 2:
        raise ValueError(f"x's last dimension must be even (gate and up halves), got {x.shape[1]}")
    num_tokens, inter = x.shape[0], x.shape[1] // 2
    if out is None:
        out = torch.empty(num_tokens, inter, dtype=x.dtype, device=x.device)
    elif out.shape != (num_tokens, inter) or out.dtype != x.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be ({num_tokens}, {inter}) {x.dtype}, got {tuple(out.shape)} {out.dtype}")
    check_same_device(x=x, out=out)
    check_runnable(_gated_activation_kernel, x.device)
    if num_tokens == 0:
        return out
    block = min(1024, triton.next_power_of_2(inter))
    _gated_activation_kernel[(num_tokens, triton.cdiv(inter, block))](
        out, x, inter, x.stride(0), out.stride(0), BLOCK=block, GELU=gelu
    )
    return out
