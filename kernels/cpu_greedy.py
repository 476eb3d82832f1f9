"""Exact greedy tokens from a bf16 screen of the LM head (kernels/cpu/greedy_head.cpp).

    norms = row_norms(weight)                                  # once per weight
    tokens = screened_argmax(approx, h, weight, norms)         # approx = bf16(h) @ bf16(weight).T, bf16

The native op proves from a rigorous error bound which few tokens can still be the argmax and
compares only those exactly; a row it cannot bound (an inf or NaN anywhere) comes back as -1 and is
computed here in full fp32, so the result is always torch.argmax's, ties to the lowest id.
"""

from __future__ import annotations

import torch

_NORM_CHUNK = 4096  # weight rows per float64 norm pass: no float64 copy of the whole matrix


def row_norms(weight: torch.Tensor) -> torch.Tensor:
    """fp32 [V]: each row's 2-norm, computed in float64 and rounded up (the bound needs >= the truth)."""
    out = torch.empty(weight.shape[0], dtype=torch.float32)
    for start in range(0, weight.shape[0], _NORM_CHUNK):
        chunk = weight[start : start + _NORM_CHUNK].double()
        out[start : start + _NORM_CHUNK] = chunk.norm(dim=1) * (1 + 1e-6)
    return out


def screened_argmax(
    approx: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, norms: torch.Tensor
) -> torch.Tensor:
    """int64 [N]: argmax_j h[i] . weight[j] for each row i, from approx [N, V] bf16 and h [N, K] fp32."""
    if h.stride(-1) != 1:
        h = h.contiguous()
    tokens = torch.ops.bulkrun_cpu.greedy_head(approx, h, weight, norms)
    unbounded = (tokens < 0).nonzero().squeeze(1)
    if unbounded.numel():
        rows = h.index_select(0, unbounded)
        tokens.index_copy_(0, unbounded, (rows @ weight.T).argmax(dim=-1))
    return tokens
