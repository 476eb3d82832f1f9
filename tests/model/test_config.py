"""ModelConfig: what we read from config.json, and what we refuse (with the reason named)."""

from __future__ import annotations

import json

import pytest
import torch

from bulkrun.model.config import ModelConfig, UnsupportedModelError

BASE = dict(
    model_type="llama",
    vocab_size=100,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    eos_token_id=2,
)


def test_transformers5_rope_parameters_and_defaults():
    cfg = ModelConfig.from_hf_dict(
        BASE | {"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}
    )
    assert cfg.rope_theta == 100000.0 and cfg.rope_scaling is None
    assert cfg.head_dim == 16 and cfg.num_kv_heads == 2 and cfg.max_model_len == 512
    assert not cfg.qkv_bias and not cfg.qk_norm and not cfg.tie_word_embeddings


def test_older_rope_theta_and_rope_scaling_keys():
    cfg = ModelConfig.from_hf_dict(
        BASE | {"rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.0}}
    )
    assert cfg.rope_theta == 5e5 and cfg.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    default = ModelConfig.from_hf_dict(BASE | {"rope_theta": 5e5})
    torch.testing.assert_close(cfg.inv_freq(), default.inv_freq() / 2.0)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"model_type": "gpt2"}, "unsupported model type 'gpt2'"),
        ({"architectures": ["LlamaForSequenceClassification"]}, "LlamaForSequenceClassification"),
        (
            {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0}},
            "rope scaling type 'dynamic'",
        ),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope scaling type 'dynamic'"),
        ({"hidden_act": "gelu"}, "activation 'gelu'"),
        ({"num_key_value_heads": 3}, "4 attention heads do not divide into 3 kv heads"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ],
)
def test_unsupported_configs_are_refused_by_name(change, message):
    with pytest.raises(UnsupportedModelError, match=message):
        ModelConfig.from_hf_dict(BASE | change)


def test_family_specific_fields():
    qwen2 = ModelConfig.from_hf_dict(BASE | {"model_type": "qwen2", "sliding_window": 64})
    assert qwen2.qkv_bias and not qwen2.o_bias and qwen2.max_model_len == 512  # window unused
    qwen3 = ModelConfig.from_hf_dict(BASE | {"model_type": "qwen3", "head_dim": 32, "attention_bias": True})
    assert qwen3.qk_norm and qwen3.qkv_bias and qwen3.o_bias and qwen3.head_dim == 32
    mistral = ModelConfig.from_hf_dict(BASE | {"model_type": "mistral", "sliding_window": 128})
    assert mistral.max_model_len == 128  # served exactly only within the window


def test_eos_ids_from_config_and_generation_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BASE | {"eos_token_id": [2, 7]}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 9}))
    assert ModelConfig.from_model_dir(tmp_path).eos_token_ids == (2, 7, 9)
