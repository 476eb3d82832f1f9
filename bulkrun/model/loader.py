"""Load a Hugging Face safetensors checkpoint into our fused-projection model of its family (on the
CPU, from the converted copy weight_cache keeps after the first load)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from bulkrun.model import mxfp4, weight_cache
from bulkrun.model.config import ModelConfig
from bulkrun.model.decoder import DecoderLM
from bulkrun.model.gemma import GemmaForCausalLM
from bulkrun.model.llama import LlamaForCausalLM
from bulkrun.model.moe import MoeForCausalLM

# model type -> our model class (the Llama family otherwise)
_FAMILIES: dict[str, type[DecoderLM]] = {
    "gemma2": GemmaForCausalLM, "gemma3_text": GemmaForCausalLM,
    "qwen2_moe": MoeForCausalLM, "qwen3_moe": MoeForCausalLM, "mixtral": MoeForCausalLM,
    "gpt_oss": MoeForCausalLM,
}  # fmt: skip
# An MoE block's parameters <- transformers' per-expert weights ({e}: every expert in turn), by family:
# (block prefix, gate, up, down) names
_MOE_NAMES = {
    "mixtral": ("block_sparse_moe", "w1", "w3", "w2"),
    "qwen2_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
}

# Our fused parameter <- transformers' parameters, concatenated along dim 0 in this order.
_FUSED = {
    "attn.qkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "attn.qkv.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "attn.o.weight": ("self_attn.o_proj.weight",),
    "attn.o.bias": ("self_attn.o_proj.bias",),
    "attn.q_norm": ("self_attn.q_norm.weight",),
    "attn.k_norm": ("self_attn.k_norm.weight",),
    "attn.sinks": ("self_attn.sinks",),
    "mlp.gate_up.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.gate_up.bias": ("mlp.gate_proj.bias", "mlp.up_proj.bias"),
    "mlp.down.weight": ("mlp.down_proj.weight",),
    "mlp.down.bias": ("mlp.down_proj.bias",),
    "input_norm": ("input_layernorm.weight",),
    "post_attention_norm": ("post_attention_layernorm.weight",),
    "pre_feedforward_norm": ("pre_feedforward_layernorm.weight",),
    "post_feedforward_norm": ("post_feedforward_layernorm.weight",),
}
# Phi-3 stores q/k/v and gate/up fused already, in our order
_FUSED_AS_STORED = {"phi3": {"attn.qkv.weight": ("self_attn.qkv_proj.weight",),
                             "mlp.gate_up.weight": ("mlp.gate_up_proj.weight",)}}  # fmt: skip
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# a multimodal checkpoint's text model, under the names a text-only one uses; its vision tower unread
_RENAMED_PREFIXES = {"model.language_model.": "model.", "language_model.model.": "model.",
                     "language_model.lm_head.": "lm_head."}  # fmt: skip
_UNREAD_PREFIXES = (
    "model.vision_tower.",
    "model.multi_modal_projector.",
    "vision_tower.",
    "multi_modal_projector.",
)


# A CPU model in a narrower dtype keeps these in float32: the LM head's logits (and the exact greedy
# screen over them) stay fp32 products of the bf16 hidden state, and the embedding is tied to it.
_FP32_ON_CPU = ("embed_tokens", "lm_head.weight")


def param_dtype(name: str, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype parameter `name` is stored in for a model run in `dtype` on `device`."""
    return torch.float32 if device.type == "cpu" and name in _FP32_ON_CPU else dtype


def model_class(cfg: ModelConfig) -> type[DecoderLM]:
    return _FAMILIES.get(cfg.model_type, LlamaForCausalLM)


def load_model(model_dir: str | Path, ops, dtype: torch.dtype, device: torch.device) -> DecoderLM:
    """Build the model for model_dir's config and fill every parameter from its safetensors files."""
    model_dir = Path(model_dir)
    cfg = ModelConfig.from_model_dir(model_dir)
    model = model_class(cfg)(cfg, ops)
    cached = weight_cache.cache_path(model_dir, dtype) if _cacheable(model_dir, device) else None
    if cached is None or not _fill_from_cache(model, cached, dtype, device):
        _fill_from_checkpoint(model, model_dir, cfg, dtype, device)
        if cached is not None:
            weight_cache.write(cached, dict(model.named_parameters()))
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens
    model.init_rotary(cfg.max_model_len)
    if ops.backend == "cpu" and dtype != torch.float32:  # native mixed-dtype norms
        model.residual_dtype = torch.float32
    return model.eval()


def _cacheable(model_dir: Path, device: torch.device) -> bool:
    return device.type == "cpu" and weight_cache.worth_caching(model_dir)


def _fill_from_cache(model: DecoderLM, path: Path, dtype: torch.dtype, device: torch.device) -> bool:
    """Point every parameter at its tensor in the mapped cache file; False (nothing changed) when
    there is no file or it does not hold exactly this model's parameters."""
    tensors = weight_cache.read(path)
    params = dict(model.named_parameters())
    if tensors is None or tensors.keys() != params.keys():
        return False
    for name, param in params.items():
        t = tensors[name]
        if t.shape != param.shape or t.dtype != param_dtype(name, dtype, device):
            return False
    for name, param in params.items():
        param.data = tensors[name]
    return True


def _fill_from_checkpoint(model, model_dir: Path, cfg: ModelConfig, dtype, device) -> None:
    """Fill every parameter from the safetensors files (fusing, casting); refuse missing or extra weights."""
    tensors = _with_model_prefix(_open_checkpoint(model_dir))
    if cfg.quantization == "mxfp4":  # packed experts: each loads de-quantized, one at a time
        tensors = mxfp4.dequantizing(tensors, dtype)
    used: set[str] = set()
    for name, param in model.named_parameters():
        sources = _sources(name, cfg)
        missing = [s for s in sources if s not in tensors]
        if missing:
            raise ValueError(f"checkpoint in {model_dir} lacks {missing[0]} (needed for {name})")
        value = (
            torch.cat([tensors[s]() for s in sources], dim=0) if len(sources) > 1 else tensors[sources[0]]()
        )
        value = _convert_as_stored(name, value, cfg)
        if param.dim() == 3 and value.numel() == param.numel():  # experts stacked: [E * rows, cols]
            value = value.view(param.shape)
        if value.shape != param.shape:
            raise ValueError(f"{sources[0]} has shape {tuple(value.shape)}, expected {tuple(param.shape)}")
        if cfg.norm_offset and name.endswith("norm"):  # Gemma's (1 + w) RMSNorm, as a plain weight
            value = value.float() + 1.0
        value = value.to(device=device, dtype=param_dtype(name, dtype, device)).contiguous()
        param.data = weight_cache.aligned(value)  # never a misaligned view of the mapped checkpoint
        used.update(sources)
    if cfg.tie_word_embeddings:
        used.add("lm_head.weight")
    unexpected = [n for n in tensors if n not in used and not n.endswith(_IGNORED_SUFFIXES)]
    if unexpected:
        raise ValueError(f"checkpoint in {model_dir} has weights this model does not use: {unexpected[:5]}")


def _sources(name: str, cfg: ModelConfig) -> tuple[str, ...]:
    if name == "embed_tokens":
        return ("model.embed_tokens.weight",)
    if name == "norm":
        return ("model.norm.weight",)
    if name == "lm_head.weight":
        return ("lm_head.weight",)
    _, index, local = name.split(".", 2)  # layers.{i}.{local}
    if local.startswith("mlp.") and local.split(".")[1] in _MOE_PARAMS:
        return tuple(f"model.layers.{index}.{s}" for s in _moe_sources(local.split(".", 1)[1], cfg))
    fused = _FUSED_AS_STORED.get(cfg.model_type, {}).get(local) or _FUSED[local]
    return tuple(f"model.layers.{index}.{s}" for s in fused)


_MOE_PARAMS = ("router", "w_gate_up", "w_down", "shared_expert", "shared_expert_gate", "b_gate_up", "b_down")
# gpt-oss keeps each layer's experts as single tensors: x @ W, gate and up columns interleaved
_GPT_OSS_EXPERTS = {"router.weight": "mlp.router.weight", "router.bias": "mlp.router.bias",
                    "w_gate_up": "mlp.experts.gate_up_proj", "b_gate_up": "mlp.experts.gate_up_proj_bias",
                    "w_down": "mlp.experts.down_proj", "b_down": "mlp.experts.down_proj_bias"}  # fmt: skip


def _convert_as_stored(name: str, value: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """gpt-oss's experts to our layout: [E, out, in] weights, gate rows then up rows."""
    if cfg.model_type != "gpt_oss" or not name.split(".")[-1].startswith(("w_", "b_")):
        return value
    if name.endswith(("w_gate_up", "w_down")):
        value = value.transpose(1, 2)
    if name.endswith(("w_gate_up", "b_gate_up")):
        value = torch.cat((value[:, 0::2], value[:, 1::2]), dim=1)
    return value.contiguous()


def _moe_sources(local: str, cfg: ModelConfig) -> tuple[str, ...]:
    if cfg.model_type == "gpt_oss":
        return (_GPT_OSS_EXPERTS[local],)
    block, gate, up, down = _MOE_NAMES[cfg.model_type]
    experts = range(cfg.moe.num_experts)
    if local == "router.weight":
        return (f"{block}.gate.weight",)
    if local == "w_gate_up":
        return tuple(f"{block}.experts.{e}.{w}.weight" for e in experts for w in (gate, up))
    if local == "w_down":
        return tuple(f"{block}.experts.{e}.{down}.weight" for e in experts)
    if local == "shared_expert_gate.weight":
        return (f"{block}.shared_expert_gate.weight",)
    # the shared expert: a dense gated MLP under the block's name
    return tuple(
        f"{block}.shared_expert.{s.removeprefix('mlp.')}" for s in _FUSED[f"mlp.{local.split('.', 1)[1]}"]
    )


def _with_model_prefix(tensors: dict) -> dict:
    """A bare transformer's checkpoint (Qwen3Model: `layers.0...`, `embed_tokens.weight`) under the
    causal LM's names (`model.layers.0...`)."""
    if "model.embed_tokens.weight" in tensors or "embed_tokens.weight" not in tensors:
        return tensors
    return {name if name == "lm_head.weight" else f"model.{name}": load for name, load in tensors.items()}


def _open_checkpoint(model_dir: Path) -> dict:
    """name -> zero-argument loader, over model.safetensors or the shards an index names."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no .safetensors weights in {model_dir}")
    loaders = {}
    for file in files:
        handle = safe_open(str(model_dir / file), framework="pt")
        for key in handle.keys():
            if not key.startswith(_UNREAD_PREFIXES):
                loaders[_text_model_name(key)] = lambda h=handle, k=key: h.get_tensor(k)
    return loaders


def _text_model_name(key: str) -> str:
    for prefix, renamed in _RENAMED_PREFIXES.items():
        if key.startswith(prefix):
            return renamed + key[len(prefix) :]
    return key
