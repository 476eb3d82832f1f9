"""Test-local naive references: one loop per sequence/token, written for obviousness, not speed.

A second opinion beside bulkrun_kernels.reference (the CPU path), so a bug shared by the Triton kernel
and the reference still shows up.
"""

from __future__ import annotations

import torch


def paged_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, *, window=0,
                    sinks=None, softcap=0.0):  # fmt: skip
    """A dense masked softmax per query token: keys max(0, pos - window + 1) .. pos (all up to pos
    when window is 0), scores soft-capped, a sink logit per head joining the denominator."""
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    group = q.shape[1] // k_cache.shape[2]
    for s in range(seq_lens.shape[0]):
        start, end = int(query_start_loc[s]), int(query_start_loc[s + 1])
        context = int(seq_lens[s])
        slots = [int(block_tables[s, p // block_size]) * block_size + p % block_size for p in range(context)]
        k = k_cache.flatten(0, 1)[slots].float().repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v_cache.flatten(0, 1)[slots].float().repeat_interleave(group, dim=1)
        for i, t in enumerate(range(start, end)):
            pos = context - (end - start) + i
            first = max(0, pos - window + 1) if window > 0 else 0
            scores = torch.einsum("hd,lhd->hl", q[t].float(), k[first : pos + 1]) * scale
            if softcap > 0:
                scores = softcap * torch.tanh(scores / softcap)
            if sinks is not None:
                scores = torch.cat([scores, sinks.float()[:, None]], dim=1)
            probs = scores.softmax(-1)[:, : pos + 1 - first]
            out[t] = torch.einsum("hl,lhd->hd", probs, v[first : pos + 1]).to(q.dtype)
    return out


def write_kv(k, v, k_cache, v_cache, slot_mapping):
    block_size = k_cache.shape[1]
    for t in range(k.shape[0]):
        slot = int(slot_mapping[t])
        if slot < 0:
            continue
        k_cache[slot // block_size, slot % block_size] = k[t]
        v_cache[slot // block_size, slot % block_size] = v[t]


def rms_norm(x, weight, eps, residual=None):
    if residual is not None:
        x = (x.float() + residual.float()).to(x.dtype)
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight, x


def rotary(q, k, positions, cos_sin_cache):
    half = cos_sin_cache.shape[1] // 2  # the rotation covers 2 * half dims; the rest pass through
    cos = cos_sin_cache[positions.long(), :half].float()[:, None, :]
    sin = cos_sin_cache[positions.long(), half:].float()[:, None, :]

    def rotate(x):
        x1, x2 = x[..., :half].float(), x[..., half : 2 * half].float()
        turned = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
        return torch.cat([turned, x[..., 2 * half :]], dim=-1)

    return rotate(q), rotate(k)


def silu_and_mul(x):
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)
