"""What bulkrun.gguf_config sets on a config transformers read from a GGUF, and what it refuses, on
metadata as llama.cpp writes it for published models (no file, no weights)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from bulkrun.gguf_config import complete_config, refusal


def _config(**fields):
    base = dict(hidden_size=4608, num_attention_heads=32, head_dim=128, num_hidden_layers=46,
                rms_norm_eps=float(np.float32(1e-6)), rope_parameters={"rope_type": "default", "rope_theta": 1e4},
                query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                sliding_window=4096)  # fmt: skip
    return SimpleNamespace(**{**base, **fields})


def test_gemma2_fields_the_reader_drops_come_from_the_file():
    config = _config(num_hidden_layers=42, head_dim=256, hidden_size=3584, num_attention_heads=16)
    complete_config(config, {"general.architecture": "gemma2", "gemma2.attn_logit_softcapping": np.float32(20.0),
                             "gemma2.final_logit_softcapping": np.float32(10.0)})  # fmt: skip
    assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (20.0, 10.0)
    assert config.query_pre_attn_scalar == 256  # head_dim, as llama.cpp scales
    assert config.rms_norm_eps == 1e-6  # the float32 read back as the checkpoint wrote it


def test_gemma_27b_scales_queries_by_hidden_over_heads_as_llama_cpp_does():
    config = _config()  # Gemma-2-27B: 46 layers, head_dim 128, 4608 / 32 = 144
    complete_config(config, {"general.architecture": "gemma2"})
    assert config.query_pre_attn_scalar == 144


def test_gemma3_linear_rope_lands_on_the_full_attention_layers_only():
    rope = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}  # fmt: skip
    config = _config(rope_parameters=rope, num_hidden_layers=34, head_dim=256)
    complete_config(config, {"general.architecture": "gemma3", "gemma3.rope.scaling.type": "linear",
                             "gemma3.rope.scaling.factor": np.float32(8.0),
                             "gemma3.rope.freq_base_swa": np.float32(1e4)})  # fmt: skip
    assert rope["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    assert rope["sliding_attention"] == {"rope_type": "default", "rope_theta": 1e4}


def test_moe_widths_and_phi3_window_and_partial_rotary_come_from_the_file():
    config = _config(moe_intermediate_size=1408, shared_expert_intermediate_size=5632)
    del config.query_pre_attn_scalar
    complete_config(config, {"general.architecture": "qwen2moe", "qwen2moe.expert_feed_forward_length": 32,
                             "qwen2moe.expert_shared_feed_forward_length": 48})  # fmt: skip
    assert (config.moe_intermediate_size, config.shared_expert_intermediate_size) == (32, 48)
    phi = _config(sliding_window=None, hidden_size=3072, num_attention_heads=24, head_dim=None)
    complete_config(phi, {"general.architecture": "phi3", "phi3.attention.sliding_window": 2047,
                          "phi3.rope.dimension_count": 96})  # fmt: skip
    assert phi.sliding_window == 2047
    assert phi.rope_parameters["partial_rotary_factor"] == 0.75  # so ModelConfig refuses it by name


@pytest.mark.parametrize(
    ("metadata", "tensors", "reason"),
    [
        ({"general.architecture": "llama", "llama.expert_count": 8}, set(), "Mixtral-style"),
        ({"general.architecture": "gpt-oss"}, set(), "gpt-oss"),
        ({"general.architecture": "qwen2", "qwen2.rope.scaling.type": "yarn"}, set(), "(yarn)"),
        ({"general.architecture": "phi3"}, {"rope_factors_long.weight"}, "per-frequency"),
        ({"general.architecture": "llama"}, {"rope_freqs.weight"}, "per-frequency"),  # Llama 3.1
    ],
)
def test_files_the_reader_would_misread_are_refused(metadata, tensors, reason):
    assert reason in refusal(metadata, tensors)


def test_plain_and_linear_files_are_not_refused():
    assert refusal({"general.architecture": "llama", "llama.expert_count": 0}, {"output.weight"}) is None
    assert refusal({"general.architecture": "gemma3", "gemma3.rope.scaling.type": "linear"}, set()) is None
