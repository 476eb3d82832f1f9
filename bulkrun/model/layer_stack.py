"""The middle layers of a Llama-style model as one native call (KernelOps.decoder_layers, on the CPU
kernels/cpu/decoder_layers.cpp): their weights gathered once, in the order that call reads them.

Why: between its ~11 ops a layer costs ~90 us of Python (module calls, the op wrappers' checks,
allocations), ~3 ms a decode step for 30 layers. The native call runs the same ops on the same
inputs in the same order, so a row's bits do not change; it takes only layers that are exactly that
recipe, and DecoderLM runs the others (and the first and last layer: no residual yet, the sampled
rows) one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from bulkrun.model.layers import GatedMLP
from bulkrun.model.linear import Linear


@dataclass(frozen=True, slots=True)
class LayerStack:
    norms: list[torch.Tensor]  # per layer: input norm, post-attention norm
    weights: list[torch.Tensor]  # per layer: qkv, o, gate_up, down (fixed-order GEMM tiles)
    biases: list[torch.Tensor | None]
    out_features: list[int]  # of qkv, o, gate_up, down (every layer alike)
    gemm: str  # the fixed-order GEMM kernel: "amx" or "dpbf16"
    activation: str  # "silu" or "gelu_tanh"
    qkv_rotary: bool  # every q/k/v packed for the rotary GEMM (Linear.fuse_rotary), or none
    gate_up_gated: bool  # every gate_up packed for the gated GEMM (Linear.fuse_gated), or none
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    scale: float
    linears: tuple[Linear, ...]  # one layer's four: where they run (Linear.on_tiles) decides each step

    def runs(self, rows: int) -> bool:
        """Whether a step of this many rows takes the native call (each linear on its tiles)."""
        return all(linear.on_tiles(rows) for linear in self.linears)


def layer_stack(layers: list[nn.Module]) -> LayerStack | None:
    """The stack of these layers, or None where one is not exactly the native call's recipe."""
    from bulkrun.model.llama import DecoderLayer  # the Llama layer, whose recipe the call is

    if not layers:
        return None
    parts = []
    for layer in layers:
        if type(layer) is not DecoderLayer or type(layer.mlp) is not GatedMLP:
            return None
        attn, mlp = layer.attn, layer.mlp
        if attn.q_norm is not None or attn.window or attn.softcap or attn.sinks is not None:
            return None
        linears = (attn.qkv, attn.o, mlp.gate_up, mlp.down)
        if any(m.tiles is None or m.io_dtype is not None for m in linears):
            return None
        parts.append((layer, linears))
    first, linears = parts[0]
    attn = first.attn
    kernels = {m.tile_kernel for _, ls in parts for m in ls}
    same = all(
        (layer.eps, layer.attn.scale, layer.mlp.activation, [m.out_features for m in ls])
        == (first.eps, attn.scale, first.mlp.activation, [m.out_features for m in linears])
        for layer, ls in parts
    )
    gated, rotary = {ls[2].gated for _, ls in parts}, {ls[0].rotary_heads for _, ls in parts}
    if len(kernels) != 1 or not same or len(gated) != 1 or len(rotary) != 1:
        return None
    return LayerStack(
        norms=[
            w
            for layer, _ in parts
            for w in (layer.input_norm.contiguous(), layer.post_attention_norm.contiguous())
        ],
        weights=[m.tiles for _, ls in parts for m in ls],
        biases=[m.tile_bias for _, ls in parts for m in ls],
        out_features=[m.out_features for m in linears],
        gemm=kernels.pop(),
        activation=first.mlp.activation,
        qkv_rotary=rotary.pop() is not None,
        gate_up_gated=gated.pop() is not None,
        num_heads=attn.num_heads,
        num_kv_heads=attn.num_kv_heads,
        head_dim=attn.head_dim,
        eps=float(first.eps),
        scale=float(attn.scale),
        linears=linears,
    )
