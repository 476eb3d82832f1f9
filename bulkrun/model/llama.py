"""The Llama family (Llama, SmolLM2, Mistral, Qwen2, Qwen3): pre-norm layers of attention and a SwiGLU
MLP. q/k/v and gate/up projections are fused into one matmul each (the loader concatenates
transformers' separate weights)."""

from __future__ import annotations

from torch import nn

from bulkrun.model.attention_metadata import SampledRows
from bulkrun.model.config import ModelConfig
from bulkrun.model.decoder import DecoderLM
from bulkrun.model.layers import Attention, GatedMLP, add_and_norm, param


def attention_for(cfg: ModelConfig, index: int, **extra) -> Attention:
    """The layer's attention as the config describes it (shared by the families built on Llama's)."""
    scale = (cfg.query_pre_attn_scalar or cfg.head_dim) ** -0.5
    return Attention(
        cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, eps=cfg.rms_norm_eps, scale=scale,
        qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias, qk_norm=cfg.qk_norm, window=cfg.window(index),
        softcap=cfg.attn_softcap, sinks=cfg.attn_sinks, **extra,
    )  # fmt: skip


class DecoderLayer(nn.Module):
    """x -> attention(norm(x)) + x -> mlp(norm(.)) + ., the residual sums fused into the norms."""

    def __init__(self, cfg: ModelConfig, index: int, mlp: nn.Module | None = None):
        super().__init__()
        self.eps = cfg.rms_norm_eps
        self.input_norm = param(cfg.hidden_size)
        self.post_attention_norm = param(cfg.hidden_size)
        self.attn = attention_for(cfg, index)
        self.mlp = mlp or GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.hidden_act)

    def forward(self, ops, x, residual, md, cos_sin, k_cache, v_cache, keep: SampledRows | None = None):
        """keep: compute the output at these rows alone (and return the residual stream's there)."""
        h, residual = add_and_norm(ops, x, residual, self.input_norm, self.eps)
        x = self.attn(ops, h, md, cos_sin, k_cache, v_cache, keep)
        if keep is not None:
            residual = residual.index_select(0, keep.rows)
        h, residual = add_and_norm(ops, x, residual, self.post_attention_norm, self.eps)
        return self.mlp(ops, h), residual


class LlamaForCausalLM(DecoderLM):
    def make_layer(self, cfg: ModelConfig, index: int) -> nn.Module:
        return DecoderLayer(cfg, index)
