"""MoE configs: experts, top-k, renormalization, the shared expert and the dense layers as we read
them; what we refuse, named."""

from __future__ import annotations

import pytest

from bulkrun.model.config import ModelConfig, UnsupportedModelError

BASE = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096, eos_token_id=2)  # fmt: skip


def test_qwen3_moe_sparse_steps_dense_layers_and_renormalization():
    cfg = ModelConfig.from_hf_dict(BASE | dict(
        model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[3]))  # fmt: skip
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.expert_intermediate_size) == (8, 2, 32)
    assert moe.sparse_layers == (False, True, False, False) and moe.norm_topk_prob
    assert moe.weights_in_model_dtype and moe.shared_expert_intermediate_size == 0 and cfg.qk_norm


def test_qwen2_moe_shared_expert_and_bias():
    cfg = ModelConfig.from_hf_dict(BASE | dict(
        model_type="qwen2_moe", num_experts=4, num_experts_per_tok=4, moe_intermediate_size=32,
        shared_expert_intermediate_size=96, sliding_window=4096, use_sliding_window=False))  # fmt: skip
    assert cfg.moe.shared_expert_intermediate_size == 96 and not cfg.moe.norm_topk_prob
    assert cfg.qkv_bias and cfg.max_model_len == 4096


def test_mixtral_always_renormalizes_in_fp32():
    cfg = ModelConfig.from_hf_dict(
        BASE | dict(model_type="mixtral", num_local_experts=8, num_experts_per_tok=2)
    )
    assert cfg.moe.norm_topk_prob and not cfg.moe.weights_in_model_dtype
    assert cfg.moe.sparse_layers == (True,) * 4 and cfg.moe.expert_intermediate_size == 128


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(model_type="qwen3_moe", num_experts=4, num_experts_per_tok=5, moe_intermediate_size=8), "num_experts_per_tok"),
        (dict(model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8), "shared_expert"),
    ],
)  # fmt: skip
def test_what_we_do_not_implement_is_refused(change, message):
    with pytest.raises(UnsupportedModelError, match=message):
        ModelConfig.from_hf_dict(BASE | change)
