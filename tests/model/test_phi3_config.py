"""Phi-3 configs: a window on every layer served (not a cap on the context); LongRoPE's two sets of
inverse frequencies, its attention factor and partial rotary (Phi-3.5 / Phi-4-mini) read exactly as
transformers' Phi-3 reads them; what stays unsupported refused by name."""

from __future__ import annotations

import math

import pytest
import torch

from bulkrun.model.config import ModelConfig, UnsupportedModelError

PHI3 = dict(model_type="phi3", vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096, sliding_window=2047,
            eos_token_id=2)  # fmt: skip
SHORT, LONG = [1.0 + 0.1 * i for i in range(8)], [2.0 + 0.5 * i for i in range(8)]
LONGROPE = {"rope_scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": LONG},
            "original_max_position_embeddings": 512}  # fmt: skip


def test_every_layer_slides_and_the_context_is_not_capped():
    cfg = ModelConfig.from_hf_dict(PHI3)
    assert cfg.layer_windows == (2047,) * 3 and cfg.max_model_len == 4096
    assert cfg.long_rope_after is None and cfg.rotary_dim == 16


def _transformers_rotary(change: dict):
    from transformers import Phi3Config
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    fields = {k: v for k, v in (PHI3 | change).items() if k != "model_type"}
    return Phi3RotaryEmbedding(Phi3Config(**fields))


@pytest.mark.parametrize(
    "change",
    [
        LONGROPE,  # factor from max / original positions
        LONGROPE
        | {
            "partial_rotary_factor": 0.75,
            "rope_scaling": {
                "type": "longrope",
                "short_factor": SHORT[:6],
                "long_factor": LONG[:6],
                "attention_factor": 1.3,
            },
            "rope_theta": 50000.0,
        },  # fmt: skip
        {
            "rope_parameters": {
                "rope_type": "longrope",
                "short_factor": SHORT,
                "long_factor": LONG,
                "factor": 16.0,
                "rope_theta": 10000.0,
            }
        },  # fmt: skip
    ],
)
def test_longrope_frequencies_and_attention_factor_are_transformers(change):
    cfg = ModelConfig.from_hf_dict(PHI3 | change)
    theirs = _transformers_rotary(change)
    original = theirs.config.rope_parameters["original_max_position_embeddings"]
    assert cfg.long_rope_after == original
    assert cfg.rope_attention_scaling() == theirs.attention_scaling
    assert cfg.rotary_dim == 2 * theirs.inv_freq.numel()
    torch.testing.assert_close(cfg.inv_freq(), theirs.original_inv_freq, rtol=0, atol=0)
    # the long factors, as transformers' forward picks them for a sequence past the original context
    positions = torch.tensor([[0, original]])
    theirs(torch.zeros(1, dtype=torch.float32), positions)
    torch.testing.assert_close(cfg.inv_freq(long=True), theirs.inv_freq, rtol=0, atol=0)


def test_derived_attention_factor():
    cfg = ModelConfig.from_hf_dict(PHI3 | LONGROPE)
    assert cfg.rope_attention_scaling() == pytest.approx(math.sqrt(1 + math.log(8) / math.log(512)))


def test_top_level_original_context_wins_as_in_transformers():
    # Phi3Config's field (default 4096) overrides the rope dict's own entry
    scaling = {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
               "original_max_position_embeddings": 64}  # fmt: skip
    assert ModelConfig.from_hf_dict(PHI3 | {"rope_scaling": scaling}).long_rope_after == 4096
    assert ModelConfig.from_hf_dict(PHI3 | {"rope_scaling": scaling, "original_max_position_embeddings": 128}
                                    ).long_rope_after == 128  # fmt: skip


@pytest.mark.parametrize("old_name", ["su", "yarn"])
def test_older_phi3_names_for_longrope(old_name):
    cfg = ModelConfig.from_hf_dict(
        PHI3 | LONGROPE | {"rope_scaling": LONGROPE["rope_scaling"] | {"type": old_name}}
    )
    assert cfg.rope_scaling["rope_type"] == "longrope" and cfg.long_rope_after == 512


def test_partial_rotary_covers_the_leading_dims():
    cfg = ModelConfig.from_hf_dict(PHI3 | {"partial_rotary_factor": 0.75})
    assert cfg.rotary_dim == 12 and cfg.inv_freq().shape == (6,) and cfg.long_rope_after is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"partial_rotary_factor": 0.7}, "partial_rotary_factor 0.7"),  # 16 x 0.7 = 11 dims: odd
        (
            {"rope_scaling": {"type": "longrope", "short_factor": SHORT[:4], "long_factor": LONG}},
            "short_factor",
        ),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope scaling type 'dynamic'"),
    ],
)
def test_what_phi3_cannot_run_is_refused(change, message):
    with pytest.raises(UnsupportedModelError, match=message):
        ModelConfig.from_hf_dict(PHI3 | change)


@pytest.mark.parametrize(
    ("change", "message"),
    [(LONGROPE, "'longrope' for 'llama'"), ({"partial_rotary_factor": 0.75}, "partial_rotary_factor 0.75")],
)
def test_longrope_and_partial_rotary_stay_phi3_only(change, message):
    # other families' transformers code neither slices the rotation nor drops its cache at the switch
    with pytest.raises(UnsupportedModelError, match=message):
        ModelConfig.from_hf_dict(PHI3 | change | {"model_type": "llama", "sliding_window": None})
