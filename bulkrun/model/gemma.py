"""Gemma 2 and Gemma 3 (text): sliding-window and full layers as the config's layer_types say (each
layer passes its own window to the attention kernel), GeGLU, four norms per layer (the attention's
and the MLP's outputs are normed before they join the residual stream), the embedding scaled by
sqrt(hidden), attention scale query_pre_attn_scalar ** -0.5; Gemma 3 adds per-head q/k norms and a
second RoPE base for its sliding layers, Gemma 2 soft-caps the attention scores and the logits.

Gemma's RMSNorm multiplies by (1 + weight): the loader stores 1 + weight, so the shared norm applies.
"""

from __future__ import annotations

from torch import nn

from bulkrun.model.attention_metadata import SampledRows
from bulkrun.model.config import ModelConfig
from bulkrun.model.decoder import DecoderLM
from bulkrun.model.layers import GatedMLP, add_and_norm, param
from bulkrun.model.llama import attention_for


class GemmaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        self.eps = cfg.rms_norm_eps
        self.input_norm = param(cfg.hidden_size)
        self.post_attention_norm = param(cfg.hidden_size)
        self.pre_feedforward_norm = param(cfg.hidden_size)
        self.post_feedforward_norm = param(cfg.hidden_size)
        self.attn = attention_for(cfg, index)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, False, cfg.hidden_act)

    def forward(self, ops, x, residual, md, cos_sin, k_cache, v_cache, keep: SampledRows | None = None):
        """keep: compute the output at these rows alone (and return the residual stream's there)."""
        h, residual = add_and_norm(ops, x, residual, self.input_norm, self.eps)
        a = self.attn(ops, h, md, cos_sin, k_cache, v_cache, keep)
        if keep is not None:
            residual = residual.index_select(0, keep.rows)
        a = ops.rms_norm(a, self.post_attention_norm, self.eps)[0]
        h, residual = add_and_norm(ops, a, residual, self.pre_feedforward_norm, self.eps)
        m = self.mlp(ops, h)
        return ops.rms_norm(m, self.post_feedforward_norm, self.eps)[0], residual


class GemmaForCausalLM(DecoderLM):
    def make_layer(self, cfg: ModelConfig, index: int) -> nn.Module:
        return GemmaDecoderLayer(cfg, index)
