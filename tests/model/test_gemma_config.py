"""Gemma 2 / Gemma 3 configs: per-layer windows, both RoPE bases, scales and caps as we read them, in
transformers 5's form and the older one real checkpoints carry; what we refuse, named."""

from __future__ import annotations

import pytest

from bulkrun.model.config import ModelConfig, UnsupportedModelError

GEMMA3 = dict(
    model_type="gemma3_text", vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=7,
    num_attention_heads=4, num_key_value_heads=1, head_dim=256, max_position_embeddings=32768,
    hidden_activation="gelu_pytorch_tanh", sliding_window=512, query_pre_attn_scalar=256, eos_token_id=1,
)  # fmt: skip


def test_gemma3_transformers5_form():
    transformers = pytest.importorskip("transformers")
    hf = transformers.Gemma3TextConfig(**{k: v for k, v in GEMMA3.items() if k != "model_type"},
                                       rope_scaling={"rope_type": "linear", "factor": 8.0})  # fmt: skip
    cfg = ModelConfig.from_hf_dict(hf.to_dict())
    assert cfg.layer_windows == (512, 512, 512, 512, 512, 0, 512)
    assert cfg.rope_theta == 1_000_000.0 and cfg.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert cfg.local_rope_theta == 10_000.0
    assert cfg.hidden_act == "gelu_tanh" and cfg.qk_norm and cfg.embed_scale and cfg.norm_offset
    assert cfg.query_pre_attn_scalar == 256 and cfg.attn_softcap == 0.0 and cfg.final_softcap == 0.0
    assert cfg.max_model_len == 32768  # the windows are served, not a cap on the context


def test_gemma3_older_form_with_a_pattern():
    cfg = ModelConfig.from_hf_dict(
        GEMMA3
        | {
            "rope_theta": 1e6,
            "rope_local_base_freq": 10000.0,
            "sliding_window_pattern": 3,
            "rope_scaling": None,
        }  # fmt: skip
    )
    assert cfg.layer_windows == (512, 512, 0, 512, 512, 0, 512)
    assert cfg.rope_theta == 1e6 and cfg.rope_scaling is None and cfg.local_rope_theta == 10000.0


def test_gemma3_multimodal_checkpoint_reads_its_text_config():
    outer = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
             "text_config": GEMMA3 | {"layer_types": ["full_attention"] * 7}, "vision_config": {}}  # fmt: skip
    cfg = ModelConfig.from_hf_dict(outer)
    assert cfg.model_type == "gemma3_text" and cfg.layer_windows == (0,) * 7


def test_gemma2_caps_and_alternating_layers():
    cfg = ModelConfig.from_hf_dict(
        GEMMA3
        | {
            "model_type": "gemma2",
            "num_hidden_layers": 4,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "rope_theta": 10000.0,
        }  # fmt: skip
    )
    assert cfg.layer_windows == (512, 0, 512, 0)
    assert cfg.attn_softcap == 50.0 and cfg.final_softcap == 30.0
    assert cfg.local_rope_theta is None and not cfg.qk_norm  # one RoPE, no q/k norms


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"layer_types": ["chunked_attention"] * 7}, "layer_types"),
        ({"layer_types": ["full_attention"] * 3}, "layer_types"),
        ({"sliding_window": None}, "sliding_window"),
        ({"hidden_activation": "gelu"}, "activation"),
        (
            {
                "rope_parameters": {
                    "full_attention": {"rope_type": "dynamic", "factor": 2.0},
                    "sliding_attention": {"rope_type": "default"},
                }
            },
            "yarn",
        ),  # fmt: skip
        (
            {
                "rope_parameters": {
                    "full_attention": {"rope_type": "default"},
                    "sliding_attention": {"rope_type": "linear", "factor": 2.0},
                }
            },
            "sliding",
        ),  # fmt: skip
    ],
)
def test_what_we_do_not_implement_is_refused(change, message):
    with pytest.raises(UnsupportedModelError, match=message):
        ModelConfig.from_hf_dict(GEMMA3 | change)
