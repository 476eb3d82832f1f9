"""Our view of a BERT-style encoder's config.json (BERT, RoBERTa, XLM-RoBERTa), checked up front.

The families differ only in where positions start: BERT counts from 0; RoBERTa and XLM-RoBERTa from
padding_idx + 1 (transformers' create_position_ids_from_input_ids), which also takes two positions off
the longest text they can embed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bulkrun.model.config import UnsupportedModelError

ENCODER_MODEL_TYPES = ("bert", "roberta", "xlm-roberta")
_OFFSET_FROM_PADDING = ("roberta", "xlm-roberta")
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


def is_encoder_dir(model_dir: str | Path) -> bool:
    """Whether model_dir's config names one of the encoder families (read without loading anything)."""
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text()).get("model_type") in ENCODER_MODEL_TYPES
    except (OSError, ValueError):
        return False


@dataclass(frozen=True, slots=True)
class EncoderConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    layer_norm_eps: float
    hidden_act: str
    max_position_embeddings: int
    type_vocab_size: int
    pad_token_id: int
    # positions of a sequence are pad-aware counts from this (RoBERTa: padding_idx); None for BERT
    position_padding_idx: int | None

    @property
    def max_model_len(self) -> int:
        """The longest sequence (special tokens included) the position table covers."""
        offset = 0 if self.position_padding_idx is None else self.position_padding_idx + 1
        return self.max_position_embeddings - offset

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> EncoderConfig:
        return cls.from_hf_dict(json.loads((Path(model_dir) / "config.json").read_text()))

    @classmethod
    def from_hf_dict(cls, c: dict) -> EncoderConfig:
        model_type = c.get("model_type")
        if model_type not in ENCODER_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type {model_type!r} is not an encoder bulkrun runs ({', '.join(ENCODER_MODEL_TYPES)})"
            )
        if c.get("position_embedding_type", "absolute") != "absolute":
            raise UnsupportedModelError(
                f"position_embedding_type {c['position_embedding_type']!r}: only absolute positions are supported"
            )
        act = c.get("hidden_act", "gelu")
        if act not in ACTIVATIONS:
            raise UnsupportedModelError(f"hidden_act {act!r} is not supported ({', '.join(ACTIVATIONS)})")
        hidden, heads = c["hidden_size"], c["num_attention_heads"]
        if hidden % heads:
            raise UnsupportedModelError(f"hidden_size {hidden} is not a multiple of {heads} heads")
        pad = c.get("pad_token_id")
        pad = 0 if pad is None else pad
        return cls(
            model_type=model_type,
            vocab_size=c["vocab_size"],
            hidden_size=hidden,
            intermediate_size=c["intermediate_size"],
            num_layers=c["num_hidden_layers"],
            num_heads=heads,
            head_dim=hidden // heads,
            layer_norm_eps=c.get("layer_norm_eps", 1e-12),
            hidden_act=act,
            max_position_embeddings=c["max_position_embeddings"],
            type_vocab_size=c.get("type_vocab_size", 2),
            pad_token_id=pad,
            position_padding_idx=pad if model_type in _OFFSET_FROM_PADDING else None,
        )
