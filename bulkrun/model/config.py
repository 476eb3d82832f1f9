"""Our view of a Hugging Face config.json: the Llama-family fields the model needs, checked up front.

Supported: Llama (incl. SmolLM2), Mistral, Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm); tied or
untied embeddings; rope types default, linear and llama3. Anything else is refused with a message that
names what was found, before any weight is read.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

SUPPORTED_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class UnsupportedModelError(ValueError):
    """The config describes a model our engine cannot run; the message says what was found."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # the rope parameters for linear / llama3, None for default
    max_position_embeddings: int
    max_model_len: int  # what we can serve exactly (a sliding window caps it)
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> ModelConfig:
        model_dir = Path(model_dir)
        config = json.loads((model_dir / "config.json").read_text())
        generation = model_dir / "generation_config.json"
        extra_eos = json.loads(generation.read_text()).get("eos_token_id") if generation.is_file() else None
        return cls.from_hf_dict(config, extra_eos)

    @classmethod
    def from_hf_dict(cls, cfg: dict, extra_eos_token_ids=None) -> ModelConfig:
        model_type = _check_architecture(cfg)
        if cfg.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"unsupported activation {cfg['hidden_act']!r} (only silu)")
        num_heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // num_heads
        num_kv_heads = cfg.get("num_key_value_heads") or num_heads
        if num_heads % num_kv_heads:
            raise UnsupportedModelError(
                f"{num_heads} attention heads do not divide into {num_kv_heads} kv heads"
            )
        rope_theta, rope_scaling = _rope(cfg)
        max_pos = cfg.get("max_position_embeddings", 2048)
        attention_bias = bool(cfg.get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=max_pos,
            max_model_len=min(max_pos, _sliding_window(cfg, model_type) or max_pos),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or attention_bias,  # Qwen2 always has a q/k/v bias
            o_bias=attention_bias and model_type != "qwen2",
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            eos_token_ids=tuple(sorted(_ids(cfg.get("eos_token_id")) | _ids(extra_eos_token_ids))),
        )

    def inv_freq(self) -> torch.Tensor:
        """Rotary inverse frequencies, computed exactly as transformers does for each rope type."""
        dim = self.head_dim
        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        scaling = self.rope_scaling
        if scaling is None:
            return inv_freq
        if scaling["rope_type"] == "linear":
            return inv_freq / scaling["factor"]
        return _llama3_inv_freq(inv_freq, scaling)


def _check_architecture(cfg: dict) -> str:
    model_type = cfg.get("model_type")
    architectures = cfg.get("architectures") or []
    known = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"unsupported model type {model_type!r} (architectures {architectures}); bulkrun runs {known}"
        )
    expected = SUPPORTED_MODEL_TYPES[model_type]
    # the bare transformer (Qwen3Model: a decoder embedder's checkpoint, no LM head) runs the same layers
    bare = expected.removesuffix("ForCausalLM") + "Model"
    if architectures and any(a not in (expected, bare) for a in architectures):
        raise UnsupportedModelError(
            f"unsupported architectures {architectures} for model type {model_type!r}; expected {expected}"
        )
    return model_type


def _rope(cfg: dict) -> tuple[float, dict | None]:
    """(theta, scaling) from transformers 5's rope_parameters or the older rope_theta / rope_scaling."""
    params = dict(cfg.get("rope_scaling") or {})
    params.update(cfg.get("rope_parameters") or {})
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"unsupported rope scaling type {rope_type!r}; bulkrun supports {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise UnsupportedModelError(f"unsupported partial_rotary_factor {partial} (only 1.0)")
    if rope_type == "default":
        return theta, None
    scaling = {"rope_type": rope_type, "factor": float(params["factor"])}
    if rope_type == "llama3":
        scaling["low_freq_factor"] = float(params["low_freq_factor"])
        scaling["high_freq_factor"] = float(params["high_freq_factor"])
        scaling["original_max_position_embeddings"] = int(params["original_max_position_embeddings"])
    return theta, scaling


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_context = s["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _sliding_window(cfg: dict, model_type: str) -> int | None:
    """A window only matters once a sequence outgrows it; we cap the context there instead."""
    window = cfg.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
        return None
    return window or None


def _ids(value) -> set[int]:
    if value is None:
        return set()
    return {value} if isinstance(value, int) else set(value)
