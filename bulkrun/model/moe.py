"""The mixture-of-experts families (Qwen2-MoE, Qwen3-MoE, Mixtral): Llama's layers with the dense MLP
replaced, on the layers the config names, by a sparse MoE block.

The block routes as transformers does: router logits in the model dtype, softmax in fp32, top-k,
renormalized when the family says (Mixtral always, Qwen by norm_topk_prob), cast to the model dtype
(Qwen) or kept fp32 (Mixtral). The experts run through ops.fused_moe (tokens sorted by expert, grouped
GEMMs); Qwen2-MoE adds a shared expert scaled by sigmoid(shared_expert_gate(x)). Each block keeps
the tokens its experts took in the last step (the engine reports their sum as the step's expert load).
"""

from __future__ import annotations

import torch
from torch import nn

from bulkrun.model.config import ModelConfig
from bulkrun.model.decoder import DecoderLM
from bulkrun.model.layers import GatedMLP, param
from bulkrun.model.linear import Linear
from bulkrun.model.llama import DecoderLayer
from bulkrun.model.moe_config import MoeConfig


class MoEBlock(nn.Module):
    def __init__(self, hidden: int, moe: MoeConfig, activation: str = "silu"):
        super().__init__()
        self.top_k, self.norm_topk_prob = moe.top_k, moe.norm_topk_prob
        self.weights_in_model_dtype, self.activation = moe.weights_in_model_dtype, activation
        inter = moe.expert_intermediate_size
        self.topk_then_softmax = moe.topk_then_softmax
        self.swiglu = (moe.swiglu_alpha, moe.swiglu_limit) if moe.swiglu_limit > 0 else None
        self.router = Linear(hidden, moe.num_experts, bias=moe.router_bias)
        self.w_gate_up = param(moe.num_experts, 2 * inter, hidden)  # per expert: gate rows, then up rows
        self.w_down = param(moe.num_experts, hidden, inter)
        self.b_gate_up = param(moe.num_experts, 2 * inter) if moe.expert_bias else None
        self.b_down = param(moe.num_experts, hidden) if moe.expert_bias else None
        shared = moe.shared_expert_intermediate_size
        self.shared_expert = GatedMLP(hidden, shared, False, activation) if shared else None
        self.shared_expert_gate = Linear(hidden, 1, bias=False) if shared else None
        self.expert_tokens: torch.Tensor | None = None  # [E]: the last step's tokens per expert

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(top-k expert ids [T, k], their weights [T, k]) exactly as transformers computes them."""
        if self.topk_then_softmax:  # gpt-oss: the top k logits, then a softmax over them
            values, ids = torch.topk(self.router(x), self.top_k, dim=-1)
            return ids, torch.softmax(values, dim=1, dtype=values.dtype)
        probs = torch.softmax(self.router(x).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, weights.to(x.dtype) if self.weights_in_model_dtype else weights

    def forward(self, ops, x: torch.Tensor) -> torch.Tensor:
        ids, weights = self.route(x)
        out, self.expert_tokens = ops.fused_moe(
            x, self.w_gate_up, self.w_down, ids, weights, self.activation,
            b_gate_up=self.b_gate_up, b_down=self.b_down, swiglu=self.swiglu,
        )  # fmt: skip
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(ops, x)
        return out


class MoeForCausalLM(DecoderLM):
    def make_layer(self, cfg: ModelConfig, index: int) -> nn.Module:
        if not cfg.moe.is_sparse(index):
            return DecoderLayer(cfg, index)
        return DecoderLayer(cfg, index, mlp=MoEBlock(cfg.hidden_size, cfg.moe, cfg.hidden_act))

    def expert_load(self) -> torch.Tensor | None:
        """Tokens routed to each expert in the last step, summed over the MoE layers ([E], on the device)."""
        counts = [
            m.expert_tokens for m in self.modules() if isinstance(m, MoEBlock) and m.expert_tokens is not None
        ]
        return torch.stack(counts).sum(0) if counts else None
