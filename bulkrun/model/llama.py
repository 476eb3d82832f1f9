"""The Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2, Qwen3) over one packed step.

All scheduled tokens of all sequences arrive as one [T] id tensor (no padding); the AttentionMetadata
says where each token sits and where its K/V goes in the paged cache. q/k/v and gate/up projections
are fused into one matmul each (the loader concatenates transformers' separate weights).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bulkrun.model.attention_metadata import AttentionMetadata
from bulkrun.model.config import ModelConfig
from bulkrun.model.linear import Linear


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.eps = cfg.rms_norm_eps
        self.qkv = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, cfg.qkv_bias)
        self.o = Linear(self.q_size, cfg.hidden_size, cfg.o_bias)
        self.q_norm = _param(cfg.head_dim) if cfg.qk_norm else None
        self.k_norm = _param(cfg.head_dim) if cfg.qk_norm else None

    def forward(self, ops, x, md: AttentionMetadata, cos_sin, k_cache, v_cache) -> torch.Tensor:
        T = x.shape[0]
        qkv = self.qkv(x)
        q, k, v = qkv.split((self.q_size, self.kv_size, self.kv_size), dim=-1)
        q = q.view(T, self.num_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # Qwen3: RMSNorm over each head before the rotation
            q = ops.rms_norm(q.reshape(-1, self.head_dim), self.q_norm, self.eps)[0].view(q.shape)
            k = ops.rms_norm(k.reshape(-1, self.head_dim), self.k_norm, self.eps)[0].view(k.shape)
        q, k = ops.rotary(q, k, md.positions, cos_sin, q_out=q, k_out=k)  # in place, as for the norms
        ops.write_kv(k, v, k_cache, v_cache, md.slot_mapping)
        extra = {"plan": md.plan} if md.plan is not None else {}
        o = ops.paged_attention(
            q, k_cache, v_cache, md.block_tables, md.query_start_loc, md.seq_lens, self.scale, **extra
        )
        return self.o(o.view(T, self.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, cfg.mlp_bias)
        self.down = Linear(cfg.intermediate_size, cfg.hidden_size, cfg.mlp_bias)

    def forward(self, ops, x: torch.Tensor) -> torch.Tensor:
        return self.down(ops.silu_and_mul(self.gate_up(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.eps = cfg.rms_norm_eps
        self.input_norm = _param(cfg.hidden_size)
        self.post_attention_norm = _param(cfg.hidden_size)
        self.attn = Attention(cfg)
        self.mlp = MLP(cfg)

    def forward(self, ops, x, residual, md, cos_sin, k_cache, v_cache):
        h, residual = _add_and_norm(ops, x, residual, self.input_norm, self.eps)
        x = self.attn(ops, h, md, cos_sin, k_cache, v_cache)
        h, residual = _add_and_norm(ops, x, residual, self.post_attention_norm, self.eps)
        return self.mlp(ops, h), residual


def _add_and_norm(ops, x, residual, weight, eps):
    """(rmsnorm(x + residual) * weight, x + residual), written over x and residual: both are dead
    afterwards, and reusing their memory (still in cache) spares a prompt chunk two fresh buffers."""
    if residual is None:
        return ops.rms_norm(x, weight, eps)
    return ops.rms_norm(x, weight, eps, residual, out=x, residual_out=residual)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, ops):
        super().__init__()
        self.cfg, self.ops = cfg, ops
        self.embed_tokens = _param(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = _param(cfg.hidden_size)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens
        self.register_buffer("cos_sin_cache", torch.empty(0), persistent=False)

    def init_rotary(self, max_positions: int) -> None:
        """cos_sin_cache[p] = [cos(p * f) | sin(p * f)], computed in fp32 as transformers does. On the
        CPU it stays fp32 whatever the model's dtype (the rotation runs in fp32 and rounds q and k
        once); elsewhere it takes the model's dtype."""
        inv_freq = self.cfg.inv_freq()
        freqs = torch.arange(max_positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
        device = self.norm.device
        self.cos_sin_cache = cache.to(
            device=device, dtype=torch.float32 if device.type == "cpu" else self.norm.dtype
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        md: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Run the packed step; return fp32 logits [len(logits_indices), vocab] for those rows only."""
        return self.logits(self.final_hidden(input_ids, md, kv_caches, logits_indices))

    def final_hidden(self, input_ids, md: AttentionMetadata, kv_caches, logits_indices) -> torch.Tensor:
        """Run the packed step; return the LM head's input (the final normed hidden state) for the
        logits_indices rows only, [len(logits_indices), hidden]."""
        # the embedding may be kept wider than the layers (a CPU bf16 model's is fp32, tied to the head)
        x, residual = F.embedding(input_ids, self.embed_tokens).to(self.norm.dtype), None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(self.ops, x, residual, md, self.cos_sin_cache, k_cache, v_cache)
        if logits_indices.numel() == 0:
            return x[:0]
        x, residual = x.index_select(0, logits_indices), residual.index_select(0, logits_indices)
        return self.ops.rms_norm(x, self.norm, self.cfg.rms_norm_eps, residual)[0]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """fp32 logits [N, vocab] of final hidden rows h [N, hidden] (in the head's own dtype: a CPU
        bf16 model's head is fp32, so its logits are fp32 products of the bf16 hidden rows)."""
        if h.shape[0] == 0:
            return torch.empty(0, self.cfg.vocab_size, dtype=torch.float32, device=h.device)
        return self.lm_head(h.to(self.lm_head.dtype)).float()
