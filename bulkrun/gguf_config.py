"""What transformers' GGUF reader leaves out of a model's config, read back from the file's metadata.

transformers rebuilds a config from a GGUF's llama.cpp keys, but only from the keys it maps; every
other field keeps its config class's default, one checkpoint's value silently applied to another
(Gemma 2's soft-caps, the Qwen MoEs' expert widths, Phi-3's window, Gemma 3's scaled global RoPE).
`complete_config` sets those fields from the keys llama.cpp's converter writes. `refusal` names the
files the converter would turn into a different model (experts dropped, RoPE scaling lost) and that
bulkrun therefore does not convert.
"""

from __future__ import annotations

from pathlib import Path

# config field <- the GGUF key (after `{arch}.`) llama.cpp writes it under, where transformers drops it;
# set only on a config class that has the field
_DROPPED_KEYS = {
    "head_dim": "attention.key_length",
    "moe_intermediate_size": "expert_feed_forward_length",
    "shared_expert_intermediate_size": "expert_shared_feed_forward_length",
    "attn_logit_softcapping": "attn_logit_softcapping",
    "final_logit_softcapping": "final_logit_softcapping",
    "sliding_window": "attention.sliding_window",
}
# RoPE scaling stored as tensors: LongRoPE's factors (Phi-3) and Llama 3's (rope_freqs)
_ROPE_FACTOR_TENSORS = {"rope_factors_long.weight", "rope_freqs.weight"}
# llama.cpp scales Gemma's queries by head_dim ** -0.5, except in the 27B models (which it tells
# apart by their layer count): (hidden / heads) ** -0.5. The file states no scale; its reader decides.
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def read_metadata(path: Path) -> tuple[dict, set[str]]:
    """The file's metadata (key -> value; the tokenizer's arrays left out) and its tensor names."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    return fields, {t.name for t in reader.tensors}


def refusal(metadata: dict, tensor_names: set[str]) -> str | None:
    """Why transformers' converter would load this file as a different model, or None."""
    arch = metadata.get("general.architecture")
    if arch == "llama" and metadata.get("llama.expert_count"):
        return (
            "a Mixtral-style GGUF (architecture 'llama' with experts): transformers' GGUF reader reads "
            "it as a dense Llama and drops the experts; use the Hugging Face checkpoint"
        )
    if arch == "gpt-oss":
        return (
            "a gpt-oss GGUF: transformers' GGUF reader cannot read its RoPE metadata or its stacked "
            "experts; use the Hugging Face checkpoint (de-quantized)"
        )
    scaling = metadata.get(f"{arch}.rope.scaling.type")
    if tensor_names & _ROPE_FACTOR_TENSORS:
        scaling = "per-frequency factors"
    if scaling not in (None, "none", "linear"):
        return (
            f"RoPE scaling ({scaling}) in a GGUF ({arch}): transformers' GGUF reader drops it; use the "
            "Hugging Face checkpoint"
        )
    return None


def complete_config(config, metadata: dict) -> None:
    """Set on `config` (a transformers config read from the same file) what its reader dropped."""
    arch = metadata["general.architecture"]

    def key(name: str):
        return metadata.get(f"{arch}.{name}")

    for field, name in _DROPPED_KEYS.items():
        if key(name) is not None and hasattr(config, field):
            setattr(config, field, _number(key(name)))
    if hasattr(config, "rms_norm_eps"):
        config.rms_norm_eps = _number(config.rms_norm_eps)
    _complete_rope(config, key)
    if arch in _GEMMA_27B_LAYERS:
        big = config.num_hidden_layers == _GEMMA_27B_LAYERS[arch]
        config.query_pre_attn_scalar = (
            config.hidden_size // config.num_attention_heads if big else config.head_dim
        )


def _complete_rope(config, key) -> None:
    """The linear scaling factor (on the full-attention layers where RoPE is per layer type), the
    sliding layers' own base, and a rotary width narrower than the head, from the file."""
    params = config.rope_parameters
    nested = "full_attention" in params  # transformers 5 keeps Gemma 3's RoPE per layer type
    main = params["full_attention"] if nested else params
    if key("rope.scaling.type") == "linear":
        main.update(rope_type="linear", factor=_number(key("rope.scaling.factor")))
    if nested and key("rope.freq_base_swa") is not None:
        params["sliding_attention"]["rope_theta"] = _number(key("rope.freq_base_swa"))
    rotary = key("rope.dimension_count")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if rotary and rotary != head_dim and not nested:
        main["partial_rotary_factor"] = rotary / head_dim


def _number(value):
    """GGUF stores floats as float32; this is the shortest decimal that float32 holds (1e-05, not
    9.99999974e-06), which is what the checkpoint said."""
    import numpy as np

    if isinstance(value, (float, np.floating)):
        return float(str(np.float32(value)))
    return int(value)
