"""Exact greedy tokens from a bf16 or int8 screen of the LM head (kernels/cpu/greedy_head.cpp).

    norms = row_norms(weight)                                  # once per weight
    tokens = screened_argmax(approx, h, weight, norms)         # approx = bf16(h) @ bf16(weight).T, bf16
    tokens = screened_argmax_int8(h, Int8Head(weight), weight, norms)   # where AMX int8 runs
    tokens = screened_argmax_vnni(h, VnniHead(weight), weight, norms)   # where AVX512-VNNI runs

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
    return _native_says("greedy_head_int8_available")


def vnni_screen_available() -> bool:
    """Whether the VNNI int8 screen runs here (the native kernels loaded, built with AVX512-VNNI)."""
    return _native_says("greedy_head_vnni_available")


def _native_says(op: str) -> bool:
    try:
        return bool(getattr(torch.ops.bulkrun_cpu, op)())
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


class VnniHead:
    """The LM head as the VNNI screen reads it (kernels/cpu/head_vnni.h): int8 rows with a scale, a
    row sum and a quantization error norm each, and the weights at the hidden rows' outlier
    dimensions in fp32. Those dimensions are the `outliers` largest of the first rows screened (a
    model's outlier channels are its own, whatever the prompt): they only make the screen closer,
    never change a token."""

    def __init__(self, weight: torch.Tensor, outliers: int = 16):
        self.weight = weight
        self.packed, self.scales, self.err_norms, self.rowsums = torch.ops.bulkrun_cpu.pack_head_vnni(
            weight.contiguous()
        )
        self.max_scale = (
            float(self.scales.max()) if self.scales.numel() else 0.0
        )  # the bound's underflow term
        self.outliers = min(outliers, weight.shape[1])
        self.dims: torch.Tensor | None = None
        self.w_out: torch.Tensor | None = None

    def outlier_weights(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(outlier dims int64 [n], the weights there as [NB, n, 16] fp32), fixed at the first rows."""
        if self.dims is None:
            finite = h[torch.isfinite(h).all(dim=1)]
            size = finite.abs().amax(dim=0) if finite.shape[0] else torch.zeros(h.shape[1])
            self.dims = size.topk(self.outliers).indices.sort().values.contiguous()
            v = self.weight.shape[0]
            cols = torch.zeros(-(-v // 16) * 16, self.outliers)
            cols[:v] = self.weight[:, self.dims].float()
            self.w_out = cols.view(cols.shape[0] // 16, 16, self.outliers).transpose(1, 2).contiguous()
        return self.dims, self.w_out


def screened_argmax_vnni(
    h: torch.Tensor, head: VnniHead, weight: torch.Tensor, norms: torch.Tensor
) -> torch.Tensor:
    """screened_argmax's tokens, the screen the VNNI int8 product of h [N, K] fp32 and the packed head."""
    h = h.contiguous()
    dims, w_out = head.outlier_weights(h)
    tokens = torch.ops.bulkrun_cpu.greedy_head_vnni(
        h, head.packed, head.scales, head.err_norms, head.rowsums, head.max_scale, dims, w_out, weight, norms
    )
    return _full_where_unbounded(tokens, h, weight)


def _full_where_unbounded(tokens: torch.Tensor, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    unbounded = (tokens < 0).nonzero().squeeze(1)
    if unbounded.numel():
        rows = h.index_select(0, unbounded)
        tokens.index_copy_(0, unbounded, (rows @ weight.T).argmax(dim=-1))
    return tokens
