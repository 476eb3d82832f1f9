"""Our view of a Hugging Face config.json: the fields the model families need, checked up front.

Supported: Llama (incl. SmolLM2), Mistral, Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm), Phi-3
(fused qkv / gate_up weights, a window on every layer, LongRoPE and partial rotary: Phi-3-128k,
Phi-3.5, Phi-4-mini); Gemma 2 and Gemma 3 (text; per-layer sliding windows, two RoPE bases, GeGLU,
soft-capping); the MoE families in moe_config.py (gpt-oss also with MXFP4 experts, de-quantized on
load: mxfp4.py). Tied or untied embeddings; rope types default, linear, llama3, yarn, and longrope
(Phi-3 only). Anything else is refused with a message that names what was found, before any weight
is read.

LongRoPE has two sets of inverse frequencies. transformers' Phi-3 runs a sequence of at most
original_max_position_embeddings (N) tokens on the short factors, and once it grows past N drops its
cache and recomputes every position on the long ones (Phi3ForCausalLM.prepare_inputs_for_generation):
the engine does the same per request (`long_rope_after`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

SUPPORTED_MODEL_TYPES = {
    "llama": ("LlamaForCausalLM",),
    "mistral": ("MistralForCausalLM",),
    "qwen2": ("Qwen2ForCausalLM",),
    "qwen3": ("Qwen3ForCausalLM",),
    "gemma2": ("Gemma2ForCausalLM",),
    "gemma3_text": ("Gemma3ForCausalLM",),
    # the multimodal checkpoint: its text model only (text_config; the vision tower's weights unread)
    "gemma3": ("Gemma3ForConditionalGeneration", "Gemma3ForCausalLM"),
    "qwen2_moe": ("Qwen2MoeForCausalLM",),
    "qwen3_moe": ("Qwen3MoeForCausalLM",),
    "mixtral": ("MixtralForCausalLM",),
    "phi3": ("Phi3ForCausalLM",),
    "gpt_oss": ("GptOssForCausalLM",),
}
_GEMMA = ("gemma2", "gemma3_text")
_QKV_BIAS = ("qwen2", "qwen2_moe")
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
# where transformers slices the rotation to the first head_dim * partial_rotary_factor dims and
# switches LongRoPE's factors by recomputing the cache (other families' code does neither)
_PARTIAL_ROTARY_AND_LONGROPE = ("phi3",)


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
    rope_scaling: dict | None  # the rope parameters for linear / llama3 / yarn / longrope, None for default
    max_position_embeddings: int
    max_model_len: int  # what we can serve exactly (a sliding window caps it)
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...]
    # --- what the families beyond Llama add (the defaults are Llama's) ---
    hidden_act: str = "silu"  # the gated MLP's activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    layer_windows: tuple[int, ...] = ()  # per layer: its sliding window, 0 = full attention; () = all full
    local_rope_theta: float | None = None  # the sliding layers' RoPE base where it differs (Gemma 3)
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (Gemma); None: head_dim
    attn_softcap: float = 0.0  # scores = cap * tanh(scores / cap) (Gemma 2); 0: off
    final_softcap: float = 0.0  # the same on the logits
    embed_scale: bool = False  # the embedding times sqrt(hidden), in the model dtype (Gemma)
    norm_offset: bool = False  # RMSNorm weights stored as w - 1: (1 + w) * norm(x) (Gemma)
    moe: object | None = None  # moe_config.MoeConfig for the mixture-of-experts families
    attn_sinks: bool = False  # a learned sink logit per head in every attention softmax (gpt-oss)
    # the rotation covers each head's first head_dim * this dims, the rest pass through (Phi-4-mini)
    partial_rotary_factor: float = 1.0
    quantization: str | None = None  # "mxfp4": gpt-oss's packed experts, de-quantized on load (mxfp4.py)

    def window(self, layer: int) -> int:
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def rotary_dim(self) -> int:
        """The leading dims of each head the rotation covers (transformers' int(head_dim * factor))."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def long_rope_after(self) -> int | None:
        """LongRoPE: a sequence longer than this runs on the long factors (all of its positions);
        None: one set of frequencies for every length."""
        scaling = self.rope_scaling
        if scaling is None or scaling["rope_type"] != "longrope":
            return None
        return scaling["original_max_position_embeddings"]

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
        quantization = _quantization(cfg, model_type)
        if model_type == "gemma3":  # the text model of the multimodal checkpoint
            cfg = {"eos_token_id": cfg.get("eos_token_id"), **cfg["text_config"], "model_type": "gemma3_text"}
            model_type = "gemma3_text"
        act = cfg.get("hidden_activation") or cfg.get("hidden_act", "silu")
        if act not in _ACTIVATIONS:
            raise UnsupportedModelError(f"unsupported activation {act!r} (only {', '.join(_ACTIVATIONS)})")
        num_heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // num_heads
        num_kv_heads = cfg.get("num_key_value_heads") or num_heads
        if num_heads % num_kv_heads:
            raise UnsupportedModelError(
                f"{num_heads} attention heads do not divide into {num_kv_heads} kv heads"
            )
        rope_theta, rope_scaling = _rope(cfg)
        max_pos = cfg.get("max_position_embeddings", 2048)
        partial = _partial_rotary(cfg)
        rotary_dim = _rotary_dim(head_dim, partial)
        if rope_scaling is not None and rope_scaling["rope_type"] == "longrope":
            rope_scaling = _longrope(rope_scaling, cfg, rotary_dim, max_pos)
        attention_bias = bool(cfg.get("attention_bias", False))
        family = _gemma_fields(cfg, model_type) if model_type in _GEMMA else {}
        if model_type in _GEMMA:
            rope_theta, rope_scaling = family.pop("global_rope")
        if model_type in ("qwen2_moe", "qwen3_moe", "mixtral", "gpt_oss"):
            from bulkrun.model.moe_config import moe_fields

            family = moe_fields(cfg, model_type)
        if model_type == "gpt_oss":
            family |= {"layer_windows": _layer_windows(cfg, 2, model_type), "attn_sinks": True}
        if model_type == "phi3" and cfg.get("sliding_window"):  # every layer slides (transformers' Phi-3)
            family = {"layer_windows": (int(cfg["sliding_window"]),) * cfg["num_hidden_layers"]}
        served = model_type in _GEMMA or model_type in ("phi3", "gpt_oss")  # windows run, not capped
        sliding = None if served else _sliding_window(cfg, model_type)
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
            max_model_len=min(max_pos, sliding or max_pos),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=model_type in _QKV_BIAS or attention_bias,  # Qwen2 always has a q/k/v bias
            o_bias=attention_bias and model_type not in _QKV_BIAS,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=model_type in ("qwen3", "gemma3_text", "qwen3_moe"),
            eos_token_ids=tuple(sorted(_ids(cfg.get("eos_token_id")) | _ids(extra_eos_token_ids))),
            hidden_act=_ACTIVATIONS[act],
            quantization=quantization,
            **family,
            partial_rotary_factor=partial,
        )

    def inv_freq(self, local: bool = False, long: bool = False) -> torch.Tensor:
        """Rotary inverse frequencies (rotary_dim / 2 of them), computed exactly as transformers does
        for each rope type; local: the sliding layers' (their own base, no scaling) where the model
        has one; long: LongRoPE's long factors (else its short ones)."""
        dim = self.rotary_dim
        theta = self.local_rope_theta if local else self.rope_theta
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        inv_freq = 1.0 / (theta**exponents)
        scaling = None if local else self.rope_scaling
        if scaling is None:
            return inv_freq
        if scaling["rope_type"] == "linear":
            return inv_freq / scaling["factor"]
        if scaling["rope_type"] == "yarn":
            return _yarn_inv_freq(theta, dim, scaling)
        if scaling["rope_type"] == "longrope":  # _compute_longrope_parameters
            factors = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32)
            return 1.0 / (factors * theta**exponents)
        return _llama3_inv_freq(inv_freq, scaling)

    def rope_attention_scaling(self) -> float:
        """The factor on cos and sin (YaRN's and LongRoPE's attention factor, the same for both of
        LongRoPE's tables; 1 otherwise)."""
        scaling = self.rope_scaling
        if scaling is None or scaling["rope_type"] not in ("yarn", "longrope"):
            return 1.0
        if scaling["rope_type"] == "longrope":
            return scaling["attention_factor"]
        return _yarn_attention_factor(scaling)


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
    bare = expected[0].removesuffix("ForCausalLM") + "Model"
    if architectures and any(a not in (*expected, bare) for a in architectures):
        raise UnsupportedModelError(
            f"unsupported architectures {architectures} for model type {model_type!r}; expected {expected[0]}"
        )
    return model_type


def _quantization(cfg: dict, model_type: str) -> str | None:
    """The checkpoint's quantization, which the loader de-quantizes: only gpt-oss's MXFP4 experts."""
    quant = cfg.get("quantization_config")
    if not quant:
        return None
    method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
    if method != "mxfp4":
        raise UnsupportedModelError(
            f"unsupported quantization_config {method!r}: bulkrun de-quantizes only gpt-oss's MXFP4 "
            "experts; give a de-quantized checkpoint"
        )
    if model_type != "gpt_oss":
        raise UnsupportedModelError(
            f"unsupported quantization_config 'mxfp4' on model type {model_type!r}: bulkrun "
            "de-quantizes MXFP4 only for gpt-oss's experts"
        )
    return method


def _rope(cfg: dict, params: dict | None = None, default_theta: float = 10000.0) -> tuple[float, dict | None]:
    """(theta, scaling) from transformers 5's rope_parameters or the older rope_theta / rope_scaling
    (or from `params`, one layer type's entry of a per-layer-type rope_parameters)."""
    if params is None:
        params = dict(cfg.get("rope_scaling") or {})
        params.update(cfg.get("rope_parameters") or {})
    theta = float(params.get("rope_theta", cfg.get("rope_theta", default_theta)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    phi3 = cfg.get("model_type") in _PARTIAL_ROTARY_AND_LONGROPE
    if phi3 and rope_type in ("su", "yarn"):  # transformers' Phi-3 reads both as LongRoPE
        rope_type = "longrope"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"unsupported rope scaling type {rope_type!r}; bulkrun supports {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "longrope" and not phi3:
        raise UnsupportedModelError(
            f"unsupported rope scaling type 'longrope' for {cfg.get('model_type')!r} (phi3 only)"
        )
    partial = _partial_rotary(cfg, params)
    if partial != 1.0 and not phi3:
        raise UnsupportedModelError(
            f"unsupported partial_rotary_factor {partial} (only 1.0; Phi-3 takes others)"
        )
    if rope_type == "default":
        return theta, None
    if rope_type == "longrope":  # completed by _longrope once head_dim is known
        return theta, dict(params, rope_type="longrope")
    scaling = {"rope_type": rope_type, "factor": float(params["factor"])}
    if rope_type == "yarn":
        for key in ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim"):
            scaling[key] = params.get(key)
        scaling["truncate"] = params.get("truncate", True)
        old = params.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
        scaling["original_max_position_embeddings"] = int(old or cfg.get("max_position_embeddings", 2048))
    if rope_type == "llama3":
        scaling["low_freq_factor"] = float(params["low_freq_factor"])
        scaling["high_freq_factor"] = float(params["high_freq_factor"])
        old = params.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
        scaling["original_max_position_embeddings"] = int(old or cfg.get("max_position_embeddings", 2048))
    return theta, scaling


def _partial_rotary(cfg: dict, params: dict | None = None) -> float:
    if params is None:
        params = {**(cfg.get("rope_scaling") or {}), **(cfg.get("rope_parameters") or {})}
    return float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))


def _rotary_dim(head_dim: int, partial: float) -> int:
    rotary_dim = int(head_dim * partial)
    if rotary_dim <= 0 or rotary_dim % 2:
        raise UnsupportedModelError(
            f"unsupported partial_rotary_factor {partial}: head_dim {head_dim} x {partial} is not a "
            "positive even number of dims"
        )
    return rotary_dim


def _longrope(params: dict, cfg: dict, rotary_dim: int, max_pos: int) -> dict:
    """LongRoPE's parameters as transformers' _compute_longrope_parameters reads them from a Phi-3
    config: the pretraining context is the top-level original_max_position_embeddings (Phi3Config's
    field, default 4096, overrides the rope dict's); the attention factor, unless given, is
    sqrt(1 + ln(factor) / ln(original)) with factor = max_position_embeddings / original."""
    original = int(cfg.get("original_max_position_embeddings", 4096))
    factors = {}
    for key in ("short_factor", "long_factor"):
        values = params.get(key)
        if not isinstance(values, list | tuple) or len(values) != rotary_dim // 2:
            raise UnsupportedModelError(
                f"longrope {key} must list {rotary_dim // 2} numbers (rotary dims / 2), got {values!r}"
            )
        factors[key] = tuple(float(v) for v in values)
    factor = params.get("factor")
    factor = max_pos / original if factor is None else float(factor)
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return {"rope_type": "longrope", **factors, "original_max_position_embeddings": original,
            "attention_factor": float(attention)}  # fmt: skip


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


def _yarn_attention_factor(s: dict) -> float:
    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if s["attention_factor"] is not None:
        return float(s["attention_factor"])
    if s["mscale"] and s["mscale_all_dim"]:
        return float(mscale(s["factor"], s["mscale"]) / mscale(s["factor"], s["mscale_all_dim"]))
    return mscale(s["factor"])


def _yarn_inv_freq(base: float, dim: int, s: dict) -> torch.Tensor:
    """YaRN's inverse frequencies, step for step as transformers' _compute_yarn_parameters."""
    factor, old_context = s["factor"], s["original_max_position_embeddings"]
    beta_fast, beta_slow = s["beta_fast"] or 32, s["beta_slow"] or 1

    def correction_dim(rotations):
        return (dim * math.log(old_context / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def _layer_windows(cfg: dict, pattern: int, model_type: str) -> tuple[int, ...]:
    """Per layer: the sliding window of a sliding_attention layer, 0 for a full one (layer_types, or
    every `pattern`-th layer full where the config predates layer_types)."""
    num_layers = cfg["num_hidden_layers"]
    layer_types = cfg.get("layer_types")
    if layer_types is None:
        layer_types = [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)
        ]
    unknown = set(layer_types) - {"sliding_attention", "full_attention"}
    if unknown or len(layer_types) != num_layers:
        raise UnsupportedModelError(f"unsupported layer_types {layer_types} for {num_layers} layers")
    window = int(cfg.get("sliding_window") or 0)
    if window <= 0 and "sliding_attention" in layer_types:
        raise UnsupportedModelError(f"sliding_attention layers without a sliding_window ({model_type})")
    return tuple(window if t == "sliding_attention" else 0 for t in layer_types)


def _gemma_fields(cfg: dict, model_type: str) -> dict:
    """Gemma 2 / 3: the per-layer windows, both RoPE bases, the attention scale and the soft-caps."""
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedModelError(
            "unsupported use_bidirectional_attention=True (an encoder; bulkrun decodes)"
        )
    # configs older than layer_types: Gemma 2 alternates, Gemma 3 has a pattern
    pattern = 2 if model_type == "gemma2" else int(cfg.get("sliding_window_pattern", 6))
    layer_windows = _layer_windows(cfg, pattern, model_type)
    per_type = cfg.get("rope_parameters") or {}
    if "full_attention" in per_type:  # transformers 5: one rope entry per layer type
        global_rope = _rope(cfg, dict(per_type["full_attention"]), 1_000_000.0)
        local_rope = _rope(cfg, dict(per_type.get("sliding_attention") or {}), 10000.0)
    else:
        global_rope = _rope(cfg)
        local_rope = (float(cfg.get("rope_local_base_freq", global_rope[0])), None)
    if model_type == "gemma2":  # one RoPE for every layer
        local_rope = (None, None)
    if local_rope[1] is not None:
        raise UnsupportedModelError(f"unsupported rope scaling {local_rope[1]} on the sliding layers")
    return {
        "global_rope": global_rope,
        "layer_windows": layer_windows,
        "local_rope_theta": local_rope[0],
        "query_pre_attn_scalar": float(cfg.get("query_pre_attn_scalar") or cfg["head_dim"]),
        "attn_softcap": float(cfg.get("attn_logit_softcapping") or 0.0),
        "final_softcap": float(cfg.get("final_logit_softcapping") or 0.0),
        "embed_scale": True,
        "norm_offset": True,
    }


def _sliding_window(cfg: dict, model_type: str) -> int | None:
    """A window only matters once a sequence outgrows it; we cap the context there instead."""
    window = cfg.get("sliding_window")
    if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not cfg.get(
        "use_sliding_window", False
    ):
        return None
    return window or None


def _ids(value) -> set[int]:
    if value is None:
        return set()
    return {value} if isinstance(value, int) else set(value)
