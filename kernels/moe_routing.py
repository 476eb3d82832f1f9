"""The token bookkeeping of a fused mixture-of-experts step, in plain PyTorch (any device, no host sync).

Each token's k chosen experts make T * k (token, slot) rows. They are sorted by expert (stable, so
each expert's rows keep token order), gathered into one [T * k, hidden] matrix in which every
expert owns one contiguous run (offsets[e]:offsets[e + 1]), and run as grouped GEMMs over those runs:
one matmul per expert over all its tokens, never a loop over tokens. combine() puts the rows back in
(token, slot) order and adds each token's k weighted expert outputs in slot order, so a token's
result never depends on which other tokens share the step.
"""

from __future__ import annotations

import torch


def sort_by_expert(topk_ids: torch.Tensor, num_experts: int):
    """(order, counts, offsets): order[i] = the (token * k + slot) row at sorted position i; counts
    [E] int64 rows per expert (the step's expert load); offsets [E + 1] int32 run bounds."""
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    # not torch.bincount: on CUDA it reads the largest id back to size its output (a host sync,
    # which a CUDA graph cannot capture); integer adds are exact in any order
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat.long(), torch.ones_like(flat, dtype=torch.int64))
    offsets = torch.zeros(num_experts + 1, dtype=torch.int32, device=flat.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return order, counts, offsets


def expert_biases(b: torch.Tensor | None, topk_ids: torch.Tensor, order: torch.Tensor):
    """Each sorted row's expert bias ([T * k, N]), or None without biases."""
    return None if b is None else b.index_select(0, topk_ids.reshape(-1).index_select(0, order))


def clamped_swiglu(h: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's activation of [gate | up]: (clamp(up, +-limit) + 1) * g * sigmoid(alpha g), g = min(gate, limit)."""
    gate, up = h.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def combine(y_sorted: torch.Tensor, order: torch.Tensor, topk_weights: torch.Tensor, dtype) -> torch.Tensor:
    """[T * k, H] expert outputs in sorted order -> [T, H]: sum over slots of weight * output, each
    product rounded to `dtype` before the sum (as transformers adds them into a `dtype` buffer)."""
    num_tokens, k = topk_weights.shape
    y = torch.empty_like(y_sorted).index_copy_(0, order, y_sorted)
    weighted = (y.view(num_tokens, k, y.shape[1]) * topk_weights.unsqueeze(-1)).to(dtype)
    out = weighted[:, 0]
    for slot in range(1, k):  # slot order, left to right
        out = out + weighted[:, slot]
    return out
