"""The BERT-family encoder (BERT, RoBERTa, XLM-RoBERTa) over one packed batch of whole sequences.

All tokens of all sequences arrive as one [T] id tensor with cu_seqlens [B + 1] (no padding); every
token attends to every token of its own sequence (bidirectional, nothing cached). Post-norm layers:
x = LN(x + attention(x)); x = LN(x + MLP(x)). The residual stream and the norms stay fp32 whatever
the matmul dtype, so a bf16 run rounds each layer's output once, not the running sum.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from bulkrun.model.encoder_config import EncoderConfig
from bulkrun.model.linear import Linear

_ACT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}
# attention(q, k, v [T, H, D], cu_seqlens [B + 1] int32, scale, max_seqlen) -> [T, H, D]
VarlenAttention = Callable[..., torch.Tensor]


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class LayerNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight, self.bias = _param(size), _param(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=True)
        self.o = Linear(cfg.hidden_size, cfg.hidden_size, bias=True)
        self.attention_norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.up = Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.down = Linear(cfg.intermediate_size, cfg.hidden_size, bias=True)
        self.output_norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.act = _ACT[cfg.hidden_act]

    def forward(self, x, attention: VarlenAttention, cu_seqlens, max_seqlen: int) -> torch.Tensor:
        T, size = x.shape[0], self.num_heads * self.head_dim
        q, k, v = self.qkv(x.to(self.qkv.dtype)).view(T, 3, self.num_heads, self.head_dim).unbind(1)
        o = attention(q, k, v, cu_seqlens, self.head_dim**-0.5, max_seqlen)
        x = self.attention_norm(x + self.o(o.reshape(T, size)).float())
        h = self.down(self.act(self.up(x.to(self.up.dtype))))
        return self.output_norm(x + h.float())


class BertEncoder(nn.Module):
    def __init__(self, cfg: EncoderConfig, attention: VarlenAttention):
        super().__init__()
        self.cfg, self.attention = cfg, attention
        self.word_embeddings = _param(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = _param(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = _param(cfg.type_vocab_size, cfg.hidden_size)
        self.embedding_norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_layers))

    def positions(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """Each token's position in its sequence; RoBERTa's count only non-pad tokens, from
        padding_idx + 1, and a pad token sits at padding_idx (transformers' rule, exactly)."""
        starts = cu_seqlens[:-1].long()
        lengths = cu_seqlens[1:].long() - starts
        seq_start = torch.repeat_interleave(starts, lengths)
        pad = self.cfg.position_padding_idx
        if pad is None:
            return torch.arange(input_ids.shape[0], device=input_ids.device) - seq_start
        real = (input_ids != pad).long()
        running = real.cumsum(0)
        before = torch.cat((running.new_zeros(1), running))[seq_start]  # real tokens of earlier sequences
        return (running - before) * real + pad

    def forward(self, input_ids, cu_seqlens, max_seqlen: int, token_type_ids=None) -> torch.Tensor:
        """fp32 last hidden states [T, hidden] of the packed sequences."""
        x = F.embedding(input_ids, self.word_embeddings)
        x = x + F.embedding(self.positions(input_ids, cu_seqlens), self.position_embeddings)
        if token_type_ids is None:  # single texts: every token is segment 0
            x = x + self.token_type_embeddings[0]
        else:
            x = x + F.embedding(token_type_ids, self.token_type_embeddings)
        x = self.embedding_norm(x)
        for layer in self.layers:
            x = layer(x, self.attention, cu_seqlens, max_seqlen)
        return x
