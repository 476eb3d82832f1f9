"""The CPU native ops (kernels/cpu/*.cpp) behind the same signatures as reference.py.

Each wrapper allocates its outputs (or honours out=) and calls torch.ops.bulkrun_cpu; the native code
takes float32 and bfloat16 (computing in float32 either way). Inputs it does not cover (another
dtype, mixed dtypes where it needs one, an unusual head size) go to the reference instead, so a
caller never has to know which ran.
"""

from __future__ import annotations

import torch

from . import reference

_NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def _native(*tensors: torch.Tensor) -> bool:
    return all(t.dtype in _NATIVE_DTYPES and t.device.type == "cpu" for t in tensors)


def _native_same(*tensors: torch.Tensor) -> bool:
    """Native dtypes, all one of them."""
    return _native(*tensors) and len({t.dtype for t in tensors}) == 1


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    window: int = 0,
    sinks: torch.Tensor | None = None,
    softcap: float = 0.0,
    out: torch.Tensor | None = None,
    plan: reference.AttentionPlan | None = None,
    batch_invariant: bool = True,
) -> torch.Tensor:
    """See reference.paged_attention (window, sinks and softcap as ATTENTION_SIGNATURE.md says).
    batch_invariant: every query token runs as a decode row does (docs/batch-invariance.md)."""
    head_dim = q.shape[-1]
    supported = head_dim % 16 == 0 and (head_dim <= 128 or head_dim == 256) and q.stride(-1) == 1
    if not (supported and _native_same(q, k_cache, v_cache) and (out is None or out.dtype == q.dtype)):
        return reference.paged_attention(
            q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
            window=window, sinks=sinks, softcap=softcap, out=out, plan=plan, batch_invariant=batch_invariant,
        )  # fmt: skip
    if out is None:
        out = torch.empty_like(q)
    if sinks is not None:
        sinks = sinks.float().contiguous()
    torch.ops.bulkrun_cpu.paged_attention(
        q, k_cache, v_cache, _i32(block_tables), _i32(query_start_loc), _i32(seq_lens), scale,
        int(window), sinks, float(softcap), batch_invariant, out,
    )  # fmt: skip
    return out


def write_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    rows_ok = all(t.stride(-1) == 1 and t.stride(-2) == t.shape[-1] for t in (k, v))
    if not (rows_ok and _native_same(k, v, k_cache, v_cache)):
        return reference.write_kv(k, v, k_cache, v_cache, slot_mapping)
    torch.ops.bulkrun_cpu.write_kv(k, v, k_cache, v_cache, slot_mapping.long().contiguous())


def rms_norm(x, weight, eps, residual=None, out=None, residual_out=None):
    """(rmsnorm(x + residual) * weight, x + residual) in one pass; see reference.rms_norm.

    Natively the normed output has x's dtype and the sum residual's (x's without one): a bf16 model
    may carry a float32 residual stream. The weight may be float32 or bfloat16."""
    tensors = (x, weight) if residual is None else (x, weight, residual)
    mixed = residual is not None and residual.dtype != x.dtype
    if (
        x.dim() != 2
        or x.stride(-1) != 1
        or not _native(*tensors)
        or (out is not None and out.dtype != x.dtype)
    ):
        if not mixed:
            return reference.rms_norm(x, weight, eps, residual, out=out, residual_out=residual_out)
        # the reference adds in the residual's dtype; the normed output keeps x's
        normed, summed = reference.rms_norm(
            x.to(residual.dtype), weight, eps, residual, residual_out=residual_out
        )
        return (normed.to(x.dtype) if out is None else out.copy_(normed)), summed
    out = torch.empty_like(x) if out is None else out
    if residual_out is None:
        residual_out = x if residual is None else torch.empty_like(residual)
    torch.ops.bulkrun_cpu.rms_norm(x, residual, weight.contiguous(), eps, out, residual_out)
    return out, residual_out


def rotary(q, k, positions, cos_sin_cache, q_out=None, k_out=None):
    """Rotate-half rotary embedding; new tensors, or written into q_out / k_out (which may be q / k)."""
    outs_ok = all(o is None or o.dtype == q.dtype for o in (q_out, k_out))
    if (
        not (_native(q, k, cos_sin_cache) and q.dtype == k.dtype and outs_ok)
        or q.stride(-1) != 1
        or k.stride(-1) != 1
    ):
        return reference.rotary(q, k, positions, cos_sin_cache, q_out=q_out, k_out=k_out)
    q_out = torch.empty_like(q, memory_format=torch.contiguous_format) if q_out is None else q_out
    k_out = torch.empty_like(k, memory_format=torch.contiguous_format) if k_out is None else k_out
    torch.ops.bulkrun_cpu.rotary(
        q, k, positions.long().contiguous(), cos_sin_cache.contiguous(), q_out, k_out
    )
    return q_out, k_out


def silu_and_mul(x, out=None):
    """x[T, 2I] (gate then up) -> silu(gate) * up, [T, I]."""
    return _gated(x, out, torch.ops.bulkrun_cpu.silu_and_mul, reference.silu_and_mul)


def gelu_tanh_and_mul(x, out=None):
    """x[T, 2I] (gate then up) -> gelu_tanh(gate) * up, [T, I] (GeGLU)."""
    return _gated(x, out, torch.ops.bulkrun_cpu.gelu_tanh_and_mul, reference.gelu_tanh_and_mul)


def _gated(x, out, native, fallback):
    if x.dim() != 2 or x.stride(-1) != 1 or not _native(x) or (out is not None and out.dtype != x.dtype):
        return fallback(x, out=out)
    if out is None:
        out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype, device=x.device)
    native(x, out)
    return out


# Mixture of experts on the CPU: one oneDNN/MKL matmul per non-empty expert over its gathered rows
fused_moe = reference.fused_moe


def _i32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()
