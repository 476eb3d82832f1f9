"""MoE configs: experts, top-k, renormalization, the shared expert and the dense layers as we read
them; what we refuse, named."""

from __future__ import annotations

import json

import pytest
import torch

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


GPT_OSS = BASE | dict(model_type="gpt_oss", num_local_experts=8, num_experts_per_tok=4, head_dim=16,
                      sliding_window=128, attention_bias=True, layer_types=None,
                      rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                    "truncate": False, "original_max_position_embeddings": 4096},
                      rope_theta=150000.0)  # fmt: skip


def test_gpt_oss_windows_sinks_yarn_and_experts():
    cfg = ModelConfig.from_hf_dict(GPT_OSS)
    assert cfg.layer_windows == (128, 0, 128, 0) and cfg.attn_sinks and cfg.max_model_len == 4096
    assert cfg.qkv_bias and cfg.o_bias and cfg.rope_scaling["rope_type"] == "yarn"
    assert cfg.rope_attention_scaling() == pytest.approx(0.1 * __import__("math").log(32.0) + 1.0)
    moe = cfg.moe
    assert moe.topk_then_softmax and moe.router_bias and moe.expert_bias and moe.swiglu_limit == 7.0


def test_gpt_oss_yarn_frequencies_equal_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = transformers.GptOssConfig(num_hidden_layers=4, head_dim=64, num_attention_heads=8, hidden_size=512)
    cfg = ModelConfig.from_hf_dict(hf.to_dict())
    want, factor = ROPE_INIT_FUNCTIONS["yarn"](hf, None)
    assert torch.equal(cfg.inv_freq(), want) and cfg.rope_attention_scaling() == factor


def test_mxfp4_is_read_for_gpt_oss_and_refused_elsewhere():
    mxfp4 = {"quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]}}
    assert ModelConfig.from_hf_dict(GPT_OSS | mxfp4).quantization == "mxfp4"
    assert ModelConfig.from_hf_dict(GPT_OSS).quantization is None
    with pytest.raises(UnsupportedModelError, match="'mxfp4' on model type 'mixtral'"):
        ModelConfig.from_hf_dict(BASE | dict(model_type="mixtral") | mxfp4)
    for method in ("fp8", "bitsandbytes", "gptq"):
        with pytest.raises(UnsupportedModelError, match=f"unsupported quantization_config '{method}'"):
            ModelConfig.from_hf_dict(GPT_OSS | {"quantization_config": {"quant_method": method}})
        with pytest.raises(UnsupportedModelError, match=method):
            ModelConfig.from_hf_dict(
                BASE | dict(model_type="llama", quantization_config={"quant_method": method})
            )


def test_gpt_oss_stops_on_return_and_call(tmp_path):
    """gpt-oss-20b's config says <|return|> (200002); its generation_config adds <|endoftext|> and <|call|>."""
    (tmp_path / "config.json").write_text(
        json.dumps(GPT_OSS | {"vocab_size": 201088, "eos_token_id": 200002})
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [200002, 199999, 200012]}))
    assert ModelConfig.from_model_dir(tmp_path).eos_token_ids == (199999, 200002, 200012)
