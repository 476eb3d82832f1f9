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
    def attend(qs, ks, vs):  # [H, L, D] each
        probs = torch.softmax(qs.float() @ ks.float().transpose(1, 2) * scale, dim=-1)
        return probs @ vs.float()

    return _per_sequence(q, k, v, cu_seqlens, attend)


def varlen_attention_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    return _per_sequence(
        q, k, v, cu_seqlens, lambda qs, ks, vs: F.scaled_dot_product_attention(qs, ks, vs, scale=scale)
    )


def _per_sequence(q, k, v, cu_seqlens, attend) -> torch.Tensor:
    """out[s] = attend(q[s], k[s], v[s]) for each sequence s, as [H, L, D] views."""
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end > start:
            heads_first = (t[start:end].transpose(0, 1) for t in (q, k, v))
            out[start:end] = attend(*heads_first).transpose(0, 1).to(q.dtype)
    return out
