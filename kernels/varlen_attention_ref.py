"""Bidirectional attention over a packed batch of whole sequences (encoders: no KV cache, no padding).

`max_seqlen` is accepted for the Triton wrapper's signature and not needed here.
Layout: q/k/v [T, heads, D], all sequences of a step concatenated; cu_seqlens [B + 1] int32, sequence
s owns rows cu_seqlens[s]:cu_seqlens[s+1]; every query sees every key of its own sequence and none of
the others'. Two CPU versions, the Triton kernel (varlen_attention.py) must equal them:
- varlen_attention_reference: the plain math (fp32 scores and softmax), what every version is tested
  against;
- varlen_attention_sdpa: the CPU fast path, torch's fused scaled_dot_product_attention once per
  sequence (length-sorted windows make neighbours similar, but no padding is added at all).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def varlen_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end == start:
            continue
        qs, ks, vs = (t[start:end].float().transpose(0, 1) for t in (q, k, v))  # [H, L, D]
        probs = torch.softmax(qs @ ks.transpose(1, 2) * scale, dim=-1)
        out[start:end] = (probs @ vs).transpose(0, 1).to(q.dtype)
    return out


def varlen_attention_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end == start:
            continue
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))  # [H, L, D] views
        out[start:end] = F.scaled_dot_product_attention(qs, ks, vs, scale=scale).transpose(0, 1)
    return out
