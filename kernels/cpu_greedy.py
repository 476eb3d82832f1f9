"""Exact greedy tokens from a bf16 or int8 screen of the LM head (kernels/cpu/greedy_head.cpp).

    norms = row_norms(weight)                                  # once per weight
    tokens = screened_argmax(approx, h, weight, norms)         # approx = bf16(h) @ bf16(weight).T, bf16
    tokens = screened_argmax_int8(h, Int8Head(weight), weight, norms)   # where AMX int8 runs

The native op proves from a rigorous error bound which few tokens can still be the argmax and
compares only those exactly; a row it cannot bound (an inf or NaN anywhere) comes back as -1 and is
computed here in full fp32, so the result is always torch.argmax's, ties to the lowest id.
"""

from __future__ import annotations

import torch


def row_norms(weight: torch.Tensor) -> torch.Tensor:
    """fp32 [V]: each row's 2-norm, rounded up (the bound needs >= the truth). Computed in fp32 (a
    quarter of the float64 pass's start-up time): K squares and sums in any order are within
    (K + 1) 2^-24 of the exact sum of squares, so the norm within half that, and inflating it by
    K 2^-23 + 2^-20 covers that and the final roundings; squares under 2^-126 (subnormal, maybe
    flushed) lose at most K 2^-126 of the sum, sqrt(K) 2^-63 of the norm, added as sqrt(K) 2^-62."""
    k = weight.shape[1]
    norms = torch.linalg.vector_norm(weight.float(), dim=1)
    return norms * (1 + k * 2.0**-23 + 2.0**-20) + k**0.5 * 2.0**-62


def screened_argmax(
    approx: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, norms: torch.Tensor
) -> torch.Tensor:
    """int64 [N]: argmax_j h[i] . weight[j] for each row i, from approx [N, V] bf16 and h [N, K] fp32."""
    if h.stride(-1) != 1:
        h = h.contiguous()
    return _full_where_unbounded(torch.ops.bulkrun_cpu.greedy_head(approx, h, weight, norms), h, weight)


def int8_screen_available() -> bool:
    """Whether the int8 screen runs here (the native kernels loaded, AMX int8 tiles, granted by the OS)."""
    try:
        return bool(torch.ops.bulkrun_cpu.greedy_head_int8_available())
    except (AttributeError, RuntimeError):  # the native kernels are not loaded
        return False


class Int8Head:
    """The LM head as the int8 screen reads it (kernels/cpu/head_int8.h): int8 rows with a scale each,
    packed as AMX tiles, and each row's quantization error norm (the bound's term)."""

    def __init__(self, weight: torch.Tensor):
        self.packed, self.scales, self.err_norms = torch.ops.bulkrun_cpu.pack_head_int8(weight.contiguous())
        self.max_scale = (
            float(self.scales.max()) if self.scales.numel() else 0.0
        )  # the bound's underflow term


def screened_argmax_int8(
    h: torch.Tensor, head: Int8Head, weight: torch.Tensor, norms: torch.Tensor
) -> torch.Tensor:
    """screened_argmax's tokens, the screen an int8 product of h [N, K] fp32 and the packed head."""
    h = h.contiguous()
    tokens = torch.ops.bulkrun_cpu.greedy_head_int8(
        h, head.packed, head.scales, head.err_norms, head.max_scale, weight, norms
    )
    return _full_where_unbounded(tokens, h, weight)


def _full_where_unbounded(tokens: torch.Tensor, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    unbounded = (tokens < 0).nonzero().squeeze(1)
    if unbounded.numel():
        rows = h.index_select(0, unbounded)
        tokens.index_copy_(0, unbounded, (rows @ weight.T).argmax(dim=-1))
    return tokens
