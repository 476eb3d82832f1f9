"""The mixture-of-experts fields of a config (Qwen2-MoE, Qwen3-MoE, Mixtral), checked up front."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MoeConfig:
    num_experts: int
    top_k: int
    expert_intermediate_size: int
    norm_topk_prob: bool  # renormalize the top-k probabilities to sum to 1
    # Qwen casts the routing weights to the model dtype before weighing the experts; Mixtral keeps fp32
    weights_in_model_dtype: bool
    shared_expert_intermediate_size: int  # Qwen2-MoE's always-on expert (0: none)
    sparse_layers: tuple[bool, ...]  # per layer: an MoE block (True) or a dense MLP (False)
    # gpt-oss: top-k of the (biased) router logits, then a softmax over those k; experts with biases
    # and the clamped SwiGLU (gate and up interleaved in the checkpoint, split on load)
    topk_then_softmax: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    swiglu_limit: float = 0.0  # > 0: the clamped SwiGLU with this limit and swiglu_alpha
    swiglu_alpha: float = 1.702

    def is_sparse(self, layer: int) -> bool:
        return self.sparse_layers[layer]


def moe_fields(cfg: dict, model_type: str) -> dict:
    """The ModelConfig fields of an MoE family: {"moe": MoeConfig}."""
    from bulkrun.model.config import UnsupportedModelError

    num_layers = cfg["num_hidden_layers"]
    # hub configs of the Qwen MoEs say num_experts, transformers 5 saves num_local_experts
    num_experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 8)
    if model_type == "gpt_oss":
        top_k = int(cfg.get("num_experts_per_tok", 4))
        limit, alpha = float(cfg.get("swiglu_limit", 7.0)), float(cfg.get("swiglu_alpha", 1.702))
        moe = MoeConfig(num_experts, top_k, cfg["intermediate_size"], False, True, 0, (True,) * num_layers,
                        topk_then_softmax=True, router_bias=True, expert_bias=True, swiglu_limit=limit,
                        swiglu_alpha=alpha)  # fmt: skip
        return {"moe": moe}
    if model_type == "mixtral":
        norm, inter = True, cfg["intermediate_size"]
        sparse = (True,) * num_layers
        shared = 0
    else:
        norm = bool(cfg.get("norm_topk_prob", False))
        inter = cfg["moe_intermediate_size"]
        step, dense = int(cfg.get("decoder_sparse_step", 1) or 1), set(cfg.get("mlp_only_layers") or [])
        sparse = tuple(i not in dense and num_experts > 0 and (i + 1) % step == 0 for i in range(num_layers))
        shared = int(cfg.get("shared_expert_intermediate_size") or 0) if model_type == "qwen2_moe" else 0
    top_k = int(cfg.get("num_experts_per_tok", 2))
    if not 1 <= top_k <= num_experts:
        raise UnsupportedModelError(f"num_experts_per_tok {top_k} is not in 1..{num_experts} experts")
    if model_type == "qwen2_moe" and shared <= 0:
        raise UnsupportedModelError("qwen2_moe without shared_expert_intermediate_size")
    moe = MoeConfig(num_experts, top_k, inter, norm, model_type != "mixtral", shared, sparse)
    return {"moe": moe}
