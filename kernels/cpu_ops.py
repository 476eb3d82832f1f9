"""The CPU native ops (kernels/cpu/*.cpp) behind the same signatures as reference.py.

Each wrapper allocates its outputs (or honours out=) and calls torch.ops.bulkrun_cpu; inputs the
native code does not cover (a dtype other than float32, an unusual head size or block size) go to
the reference instead, so a caller never has to know which ran.
"""

from __future__ import annotations

import torch

from . import reference


def _native(*tensors: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    plan: reference.AttentionPlan | None = None,
) -> torch.Tensor:
    head_dim = q.shape[-1]
    supported = head_dim % 16 == 0 and (head_dim <= 128 or head_dim == 256) and q.stride(-1) == 1
    if not (supported and _native(q, k_cache, v_cache)):
        return reference.paged_attention(
            q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, out=out, plan=plan
        )
    if out is None:
        out = torch.empty_like(q)
    torch.ops.bulkrun_cpu.paged_attention(
        q, k_cache, v_cache, _i32(block_tables), _i32(query_start_loc), _i32(seq_lens), scale, out
    )
    return out


def write_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    rows_ok = all(t.stride(-1) == 1 and t.stride(-2) == t.shape[-1] for t in (k, v))
    if not (rows_ok and _native(k, v, k_cache, v_cache)):
        return reference.write_kv(k, v, k_cache, v_cache, slot_mapping)
    torch.ops.bulkrun_cpu.write_kv(k, v, k_cache, v_cache, slot_mapping.long().contiguous())


def rms_norm(x, weight, eps, residual=None, out=None, residual_out=None):
    """(rmsnorm(x + residual) * weight, x + residual) in one pass; see reference.rms_norm."""
    tensors = (x, weight) if residual is None else (x, weight, residual)
    if x.dim() != 2 or x.stride(-1) != 1 or not _native(*tensors):
        return reference.rms_norm(x, weight, eps, residual, out=out, residual_out=residual_out)
    out = torch.empty_like(x) if out is None else out
    if residual_out is None:
        residual_out = x if residual is None else torch.empty_like(x)
    torch.ops.bulkrun_cpu.rms_norm(x, residual, weight.contiguous(), eps, out, residual_out)
    return out, residual_out


def rotary(q, k, positions, cos_sin_cache, q_out=None, k_out=None):
    """Rotate-half rotary embedding; new tensors, or written into q_out / k_out (which may be q / k)."""
    if not _native(q, k, cos_sin_cache) or q.stride(-1) != 1 or k.stride(-1) != 1:
        return reference.rotary(q, k, positions, cos_sin_cache, q_out=q_out, k_out=k_out)
    q_out = torch.empty_like(q, memory_format=torch.contiguous_format) if q_out is None else q_out
    k_out = torch.empty_like(k, memory_format=torch.contiguous_format) if k_out is None else k_out
    torch.ops.bulkrun_cpu.rotary(
        q, k, positions.long().contiguous(), cos_sin_cache.contiguous(), q_out, k_out
    )
    return q_out, k_out


def silu_and_mul(x, out=None):
    """x[T, 2I] (gate then up) -> silu(gate) * up, [T, I]."""
    if x.dim() != 2 or x.stride(-1) != 1 or not _native(x):
        return reference.silu_and_mul(x, out=out)
    if out is None:
        out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype, device=x.device)
    torch.ops.bulkrun_cpu.silu_and_mul(x, out)
    return out


def _i32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()
