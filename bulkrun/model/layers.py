"""The layers every model family is built from, over one packed step: attention (with a per-layer
sliding window, attention sinks and score soft-capping), the gated dense MLP and the add-and-norm.

What a family needs beyond Llama is a parameter here (a window, a scale, an activation) or a layer of
its own in its module; no layer here asks which family it is in.
"""

from __future__ import annotations

import torch
from torch import nn

from bulkrun.model.attention_metadata import AttentionMetadata, SampledRows
from bulkrun.model.linear import Linear


def param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


def add_and_norm(ops, x, residual, weight, eps):
    """(rmsnorm(x + residual) * weight, x + residual), written over x and residual: both are dead
    afterwards, and reusing their memory (still in cache) spares a prompt chunk two fresh buffers."""
    if residual is None:
        return ops.rms_norm(x, weight, eps)
    return ops.rms_norm(x, weight, eps, residual, out=x, residual_out=residual)


class Attention(nn.Module):
    """q/k/v in one fused projection, optional per-head q/k RMSNorm, rotary, paged attention, o.

    window: this layer's sliding window (0: full causal); softcap: score soft-cap (0: off); sinks:
    one learned logit per query head in the softmax denominator; scale: the score scale."""

    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, *, eps: float,
                 scale: float, qkv_bias: bool = False, o_bias: bool = False, qk_norm: bool = False,
                 window: int = 0, softcap: float = 0.0, sinks: bool = False):  # fmt: skip
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_size, self.kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.scale, self.eps, self.window, self.softcap = scale, eps, window, softcap
        self.qkv = Linear(hidden, self.q_size + 2 * self.kv_size, qkv_bias)
        self.o = Linear(self.q_size, hidden, o_bias)
        self.q_norm = param(head_dim) if qk_norm else None
        self.k_norm = param(head_dim) if qk_norm else None
        self.sinks = param(num_heads) if sinks else None

    def fuse_rotary(self) -> bool:
        """Run q/k/v, rotary and the KV write as one GEMM where its tiles allow (Linear.fuse_rotary);
        the caller vouches that this layer's rotary table covers whole heads in fp32 (DecoderLM)."""
        if self.q_norm is not None:  # the norms come between the projection and the rotation
            return False
        return self.qkv.fuse_rotary(self.num_heads, self.num_kv_heads, self.head_dim)

    def _project(self, ops, x, md: AttentionMetadata, cos_sin, k_cache, v_cache) -> torch.Tensor:
        """q, rotated, [T, heads, head_dim]; k (rotated) and v written to the caches."""
        T = x.shape[0]
        qkv = self.qkv(x)
        q, k, v = qkv.split((self.q_size, self.kv_size, self.kv_size), dim=-1)
        q = q.view(T, self.num_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # RMSNorm over each head before the rotation (Qwen3, Gemma 3)
            q = ops.rms_norm(q.reshape(-1, self.head_dim), self.q_norm, self.eps)[0].view(q.shape)
            k = ops.rms_norm(k.reshape(-1, self.head_dim), self.k_norm, self.eps)[0].view(k.shape)
        q, k = ops.rotary(q, k, md.rotary_rows, cos_sin, q_out=q, k_out=k)  # in place, as the norms
        ops.write_kv(k, v, k_cache, v_cache, md.slot_mapping)
        return q

    def forward(
        self, ops, x, md: AttentionMetadata, cos_sin, k_cache, v_cache, keep: SampledRows | None = None
    ) -> torch.Tensor:
        """keep: every row's K/V go to the cache, but the output is computed at these rows alone."""
        T = x.shape[0]
        # on fused tiles (fuse_rotary) the projection rotates q and k and writes k and v itself
        q = self.qkv.rotary_forward(x, md.rotary_rows, cos_sin, md.slot_mapping, k_cache, v_cache)
        if q is None:
            q = self._project(ops, x, md, cos_sin, k_cache, v_cache)
        query_start_loc, plan = md.query_start_loc, md.plan
        if keep is not None:  # the kept rows are each their sequence's last: its own query layout
            q, query_start_loc, plan = q.index_select(0, keep.rows), keep.query_start_loc, None
            T = q.shape[0]
        extra = {"plan": plan} if plan is not None else {}
        if self.window:
            extra["window"] = self.window
        if self.softcap:
            extra["softcap"] = self.softcap
        if self.sinks is not None:
            extra["sinks"] = self.sinks.float()
        o = ops.paged_attention(
            q, k_cache, v_cache, md.block_tables, query_start_loc, md.seq_lens, self.scale, **extra
        )
        return self.o(o.view(T, self.q_size))


# the gated activation's op name, by the config's activation
_GATED_OPS = {"silu": "silu_and_mul", "gelu_tanh": "gelu_tanh_and_mul"}


def fuse_gated_mlps(model: nn.Module) -> int:
    """Fuse every packed GatedMLP's gate_up with its activation where the kernels allow; how many."""
    return sum(m.fuse_gate_up() for m in model.modules() if isinstance(m, GatedMLP))


class GatedMLP(nn.Module):
    """down(act(gate) * up), gate and up in one fused projection: SwiGLU (silu) or GeGLU (gelu_tanh)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False, activation: str = "silu"):
        super().__init__()
        self.gate_up = Linear(hidden, 2 * intermediate, bias)
        self.down = Linear(intermediate, hidden, bias)
        self.op = _GATED_OPS[activation]
        self.activation = activation

    def fuse_gate_up(self) -> bool:
        """Run gate_up and the activation as one GEMM where its tiles allow (Linear.fuse_gated)."""
        return self.gate_up.fuse_gated(self.activation)

    def forward(self, ops, x: torch.Tensor) -> torch.Tensor:
        h = self.gate_up.gated_forward(x)
        if h is None:
            h = getattr(ops, self.op)(self.gate_up(x))
        return self.down(h)
