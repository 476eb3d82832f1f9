"""The decoder-only language model every family shares: embedding, a stack of layers, final norm, LM
head, over one packed step. A family module supplies its layer (`make_layer`) and its knobs come from
the ModelConfig: an embedding scale, a second RoPE base for its sliding layers, a final logit soft-cap.

All scheduled tokens of all sequences arrive as one [T] id tensor (no padding); the AttentionMetadata
says where each token sits and where its K/V goes in the paged cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bulkrun.model.attention_metadata import AttentionMetadata
from bulkrun.model.config import ModelConfig
from bulkrun.model.layer_stack import LayerStack, layer_stack
from bulkrun.model.layers import Attention, param
from bulkrun.model.linear import Linear


class DecoderLM(nn.Module):
    def __init__(self, cfg: ModelConfig, ops):
        super().__init__()
        self.cfg, self.ops = cfg, ops
        self.embed_tokens = param(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(self.make_layer(cfg, i) for i in range(cfg.num_layers))
        self.norm = param(cfg.hidden_size)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens
        self.register_buffer("cos_sin_cache", torch.empty(0), persistent=False)
        # the sliding layers' rotary table where their RoPE base differs (Gemma 3), else None
        self.local_cos_sin_cache: torch.Tensor | None = None
        # the dtype the residual stream (the running sum of the layers' outputs) is carried in, when
        # wider than the layers': a CPU bf16 model keeps it in fp32, as its native norms take mixed
        # dtypes, so each layer's output is rounded once instead of the sum at every layer
        self.residual_dtype: torch.dtype | None = None
        self.embed_multiplier: float | None = None  # sqrt(hidden) rounded to the model dtype (Gemma)
        # the middle layers as one native call where the ops have one and the layers qualify
        # (layer_stack.py); built at the first step, after the loader has packed the weights
        self._stack: LayerStack | None = None
        self._stack_built = False

    def make_layer(self, cfg: ModelConfig, index: int) -> nn.Module:
        raise NotImplementedError

    def expert_load(self) -> torch.Tensor | None:
        """Tokens per expert in the last step (mixture-of-experts families); None for a dense model."""
        return None

    def init_rotary(self, max_positions: int) -> None:
        """cos_sin_cache[p] = [cos(p * f) | sin(p * f)] (rotary_dim columns), computed in fp32 as
        transformers does. On the CPU it stays fp32 whatever the model's dtype (the rotation runs in
        fp32 and rounds q and k once); elsewhere it takes the model's dtype. Also fixes the embedding
        scale's rounding.

        LongRoPE: rows 0..N-1 are the short factors' (N = cfg.long_rope_after: only a sequence of at
        most N tokens uses them), rows N + p the long factors' for position p; a token's row is its
        AttentionMetadata.rope_rows entry."""
        scale = self.cfg.rope_attention_scaling()  # YaRN and LongRoPE scale cos and sin
        short = self.cfg.long_rope_after
        if short is None:
            self.cos_sin_cache = self._rotary_table(self.cfg.inv_freq(), max_positions, scale)
        else:
            long = self._rotary_table(self.cfg.inv_freq(long=True), max_positions, scale)
            self.cos_sin_cache = torch.cat((self._rotary_table(self.cfg.inv_freq(), short, scale), long))
        if self.cfg.local_rope_theta is not None:
            self.local_cos_sin_cache = self._rotary_table(self.cfg.inv_freq(local=True), max_positions)
        if self.cfg.embed_scale:  # transformers multiplies by the scale in the weights' dtype
            self.embed_multiplier = torch.tensor(self.cfg.hidden_size**0.5, dtype=self.norm.dtype).item()

    def _rotary_table(self, inv_freq: torch.Tensor, max_positions: int, scale: float = 1.0) -> torch.Tensor:
        freqs = torch.arange(max_positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
        cache = torch.cat((freqs.cos() * scale, freqs.sin() * scale), dim=-1)
        device = self.norm.device
        return cache.to(device=device, dtype=torch.float32 if device.type == "cpu" else self.norm.dtype)

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
        logits_indices rows only, [len(logits_indices), hidden]. Where md.sampled is set, its rows
        are logits_indices (the StepBuilder builds both), and the last layer computes them alone."""
        # the embedding may be kept wider than the layers (a CPU bf16 model's is fp32, tied to the head)
        embedded = F.embedding(input_ids, self.embed_tokens)
        if self.embed_multiplier is not None:
            embedded = embedded * self.embed_multiplier
        if self.residual_dtype is None:
            x, residual = embedded.to(self.norm.dtype), None
        else:  # the stream starts as the embedding itself; the first norm adds a zero layer output
            x = torch.zeros(embedded.shape, dtype=self.norm.dtype, device=embedded.device)
            residual = embedded.to(self.residual_dtype)
        last = len(self.layers) - 1
        stack = self._middle_stack()
        if stack is not None and not (stack.runs(x.shape[0]) and x.is_contiguous()):
            stack = None
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches, strict=True)):
            if stack is not None and 0 < i < last:  # layers 1 .. last-1 in one call
                if i == 1:
                    x, residual = self.ops.decoder_layers(
                        stack, x, residual, md, self.cos_sin_cache, kv_caches[1:last]
                    )
                continue
            local = layer.attn.window and self.local_cos_sin_cache is not None
            cos_sin = self.local_cos_sin_cache if local else self.cos_sin_cache
            # the last layer's outputs are read at the logits rows alone: where those are the
            # sampled rows, it computes only them (md.sampled)
            keep = md.sampled if i == last else None
            x, residual = layer(self.ops, x, residual, md, cos_sin, k_cache, v_cache, keep)
        if logits_indices.numel() == 0:
            return x[:0]
        if md.sampled is None:
            x, residual = x.index_select(0, logits_indices), residual.index_select(0, logits_indices)
        # the head's input in the residual stream's dtype: the last norm's output is not rounded to bf16
        return self.ops.rms_norm(x.to(residual.dtype), self.norm, self.cfg.rms_norm_eps, residual)[0]

    def fuse_qkv_rotary(self) -> int:
        """Fuse each plain Attention's q/k/v projection with rotary and the KV write where the kernels
        allow (Attention.fuse_rotary) and its rotary table is the fp32 one over whole heads; how many.
        After packing; before the first step (the native stack reads the result)."""
        table = getattr(self, "cos_sin_cache", None)
        if table is None or table.dtype != torch.float32:
            return 0
        fused = 0
        for layer in self.layers:
            attn = getattr(layer, "attn", None)
            if type(attn) is not Attention or table.shape[1] != attn.head_dim:
                continue
            if attn.window and self.local_cos_sin_cache is not None:  # rotates by the local table
                continue
            fused += attn.fuse_rotary()
        return fused

    def _middle_stack(self) -> LayerStack | None:
        if not self._stack_built:
            native = getattr(self.ops, "decoder_layers", None) is not None
            self._stack = layer_stack(list(self.layers)[1:-1]) if native else None
            self._stack_built = True
        return self._stack

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """fp32 logits [N, vocab] of final hidden rows h [N, hidden] (in the head's own dtype: a CPU
        bf16 model's head is fp32, so its logits are fp32 products of the bf16 hidden rows), soft-
        capped where the model says (a monotonic map: the greedy argmax is the head's own)."""
        if h.shape[0] == 0:
            return torch.empty(0, self.cfg.vocab_size, dtype=torch.float32, device=h.device)
        logits = self.lm_head(h.to(self.lm_head.dtype)).float()
        cap = self.cfg.final_softcap
        return torch.tanh(logits / cap) * cap if cap else logits
