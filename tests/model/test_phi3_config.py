"""Phi-3 configs: a window on every layer served (not a cap on the context); LongRoPE and partial
rotary (Phi-3.5 / Phi-4-mini) refused by name."""

from __future__ import annotations

import pytest

from bulkrun.model.config import ModelConfig, UnsupportedModelError

PHI3 = dict(model_type="phi3", vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096, sliding_window=2047,
            eos_token_id=2)  # fmt: skip


def test_every_layer_slides_and_the_context_is_not_capped():
    cfg = ModelConfig.from_hf_dict(PHI3)
    assert cfg.layer_windows == (2047,) * 3 and cfg.max_model_len == 4096


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}},
            "longrope",
        ),
        ({"partial_rotary_factor": 0.75}, "partial_rotary_factor"),
    ],
)
def test_longrope_and_partial_rotary_are_refused(change, message):
    with pytest.raises(UnsupportedModelError, match=message):
        ModelConfig.from_hf_dict(PHI3 | change)
