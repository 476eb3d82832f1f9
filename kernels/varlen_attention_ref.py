"""Bidirectional attention over a packed batch of whole sequences (encoders: no KV cache kept).

`max_seqlen` is accepted for the Triton wrapper's signature and not needed here.
Layout: q/k/v [T, heads, D], all sequences of a step concatenated; cu_seqlens [B + 1] int32, sequence
s owns rows cu_seqlens[s]:cu_seqlens[s+1]; every query sees every key of its own sequence and none of
the others'. Two CPU versions, the Triton kernel (varlen_attention.py) must equal them:
- varlen_attention_reference: the plain math (fp32 scores and softmax), what every version is tested
  against;
- varlen_attention_sdpa: the CPU fast path, torch's fused scaled_dot_product_attention over runs of
  neighbours of similar length (length-sorted windows make them so), padded to one batch per run with
  the padding keys masked; a sequence unlike its neighbours attends alone.
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
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for first, last in _similar_runs(bounds):
        start, end = bounds[first], bounds[last]
        if last - first == 1:
            heads_first = (t[start:end].transpose(0, 1) for t in (q, k, v))
            out[start:end] = F.scaled_dot_product_attention(*heads_first, scale=scale).transpose(0, 1)
        else:
            out[start:end] = _padded_attention(q, k, v, bounds[first : last + 1], scale)
    return out


# Sequences of similar length attend in one padded call: per-call overhead, not arithmetic, is what a
# short sequence costs on the CPU. A run ends where padding would pass 1/8 of its keys, or at 64.
MAX_RUN, MAX_PADDING = 64, 0.125


def _similar_runs(bounds: list[int]) -> list[tuple[int, int]]:
    """(first, last + 1) sequence indexes of consecutive runs of similar lengths (the job sorts them)."""
    runs, first = [], 0
    longest = total = 0
    for s in range(len(bounds) - 1):
        n = bounds[s + 1] - bounds[s]
        grown_longest, grown_total, count = max(longest, n), total + n, s - first + 1
        if count > 1 and (
            count > MAX_RUN or grown_longest * count - grown_total > MAX_PADDING * grown_longest * count
        ):
            runs.append((first, s))
            first, grown_longest, grown_total = s, n, n
        longest, total = grown_longest, grown_total
    if len(bounds) > 1:
        runs.append((first, len(bounds) - 1))
    return runs


def _padded_attention(q, k, v, bounds: list[int], scale: float) -> torch.Tensor:
    """The sequences bounds[i]:bounds[i+1] (consecutive rows) padded to one [n, H, L, D] batch; keys past
    each sequence's end masked; the real rows returned in packed order."""
    start, device = bounds[0], q.device
    lengths = torch.tensor([b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)], device=device)
    n, longest = len(lengths), int(lengths.max())
    seq = torch.repeat_interleave(torch.arange(n, device=device), lengths)
    pos = (
        torch.arange(bounds[-1] - start, device=device)
        - (torch.tensor(bounds[:-1], device=device) - start)[seq]
    )

    def padded(t: torch.Tensor) -> torch.Tensor:
        batch = t.new_zeros(n, longest, *t.shape[1:])
        batch[seq, pos] = t[start : bounds[-1]]
        return batch.transpose(1, 2)  # [n, H, L, D]

    keys = (torch.arange(longest, device=device)[None, :] < lengths[:, None])[:, None, None, :]
    o = F.scaled_dot_product_attention(padded(q), padded(k), padded(v), attn_mask=keys, scale=scale)
    return o.transpose(1, 2)[seq, pos]


def _per_sequence(q, k, v, cu_seqlens, attend) -> torch.Tensor:
    """out[s] = attend(q[s], k[s], v[s]) for each sequence s, as [H, L, D] views."""
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end > start:
            heads_first = (t[start:end].transpose(0, 1) for t in (q, k, v))
            out[start:end] = attend(*heads_first).transpose(0, 1).to(q.dtype)
    return out
