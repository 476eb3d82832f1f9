"""The CPU native ops (kernels/cpu/*.cpp) behind the same signatures as reference.py.

Each wrapper allocates its outputs (or honours out=) and calls torch.ops.bulkrun_cpu; the native code
takes float32 and bfloat16 (computing in float32 either way). Inputs it does not cover (another
dtype, mixed dtypes where it needs one, an unusual head size) go to the reference instead, so a
caller never has to know which ran.
"""

from __future__ import annotations

import functools

import torch

from . import reference

_NATIVE_DTYPES = (torch.float32, torch.bfloat16)

# A decode step calls these wrappers ~10 times a layer, so their own checks are written for speed: a
# loop, not all() over a generator; is_cpu, not device.type; the op's overload looked up once.


def _native(*tensors: torch.Tensor) -> bool:
    for t in tensors:
        if not t.is_cpu or t.dtype not in _NATIVE_DTYPES:
            return False
    return True


def _native_same(*tensors: torch.Tensor) -> bool:
    """Native dtypes, all one of them."""
    dtype = tensors[0].dtype
    for t in tensors:
        if t.dtype != dtype:
            return False
    return _native(*tensors)


@functools.cache
def _op(name: str):
    """torch.ops.bulkrun_cpu.<name>'s one overload (the library is loaded before any wrapper runs)."""
    return getattr(torch.ops.bulkrun_cpu, name).default


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
    _op("paged_attention")(
        q, k_cache, v_cache, _i32(block_tables), _i32(query_start_loc), _i32(seq_lens), scale,
        int(window), sinks, float(softcap), batch_invariant, out,
    )  # fmt: skip
    return out


def write_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    rows_ok = (
        k.stride(-1) == 1
        and k.stride(-2) == k.shape[-1]
        and v.stride(-1) == 1
        and v.stride(-2) == v.shape[-1]
    )
    if not (rows_ok and _native_same(k, v, k_cache, v_cache)):
        return reference.write_kv(k, v, k_cache, v_cache, slot_mapping)
    _op("write_kv")(k, v, k_cache, v_cache, slot_mapping.long().contiguous())


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
    _op("rms_norm")(x, residual, weight.contiguous(), eps, out, residual_out)
    return out, residual_out


def rotary(q, k, positions, cos_sin_cache, q_out=None, k_out=None):
    """Rotate-half rotary embedding; new tensors, or written into q_out / k_out (which may be q / k)."""
    outs_ok = (q_out is None or q_out.dtype == q.dtype) and (k_out is None or k_out.dtype == q.dtype)
    if (
        not (_native(q, k, cos_sin_cache) and q.dtype == k.dtype and outs_ok)
        or q.stride(-1) != 1
        or k.stride(-1) != 1
    ):
        return reference.rotary(q, k, positions, cos_sin_cache, q_out=q_out, k_out=k_out)
    q_out = torch.empty_like(q, memory_format=torch.contiguous_format) if q_out is None else q_out
    k_out = torch.empty_like(k, memory_format=torch.contiguous_format) if k_out is None else k_out
    _op("rotary")(q, k, positions.long().contiguous(), cos_sin_cache.contiguous(), q_out, k_out)
    return q_out, k_out


def silu_and_mul(x, out=None):
    """x[T, 2I] (gate then up) -> silu(gate) * up, [T, I]."""
    return _gated(x, out, "silu_and_mul", reference.silu_and_mul)


def gelu_tanh_and_mul(x, out=None):
    """x[T, 2I] (gate then up) -> gelu_tanh(gate) * up, [T, I] (GeGLU)."""
    return _gated(x, out, "gelu_tanh_and_mul", reference.gelu_tanh_and_mul)


def _gated(x, out, native, fallback):
    if x.dim() != 2 or x.stride(-1) != 1 or not _native(x) or (out is not None and out.dtype != x.dtype):
        return fallback(x, out=out)
    if out is None:
        out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype, device=x.device)
    _op(native)(x, out)
    return out


def decoder_layers(stack, x, residual, md, cos_sin_cache, kv_caches, batch_invariant=True):
    """x, residual through the stack's layers (bulkrun.model.layer_stack.LayerStack: per layer the
    norms, packed linears and rotary / attention geometry) in one native call; kv_caches: theirs."""
    return _op("decoder_layers")(
        x, residual, stack.norms, stack.weights, stack.biases, stack.out_features,
        [k for k, _ in kv_caches], [v for _, v in kv_caches], stack.gemm, stack.activation,
        stack.num_heads, stack.num_kv_heads, stack.head_dim, stack.eps, stack.scale,
        md.rotary_rows.long().contiguous(), cos_sin_cache.contiguous(), md.slot_mapping.long().contiguous(),
        _i32(md.block_tables), _i32(md.query_start_loc), _i32(md.seq_lens), batch_invariant, stack.qkv_rotary,
        stack.gate_up_gated,
    )  # fmt: skip


# Mixture of experts on the CPU: one oneDNN/MKL matmul per non-empty expert over its gathered rows
fused_moe = reference.fused_moe


def _i32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()
