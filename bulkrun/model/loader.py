"""Load a Hugging Face safetensors checkpoint into our fused-projection model (on the CPU, from the
converted copy weight_cache keeps after the first load)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from bulkrun.model import weight_cache
from bulkrun.model.config import ModelConfig
from bulkrun.model.llama import LlamaForCausalLM

# Our fused parameter <- transformers' parameters, concatenated along dim 0 in this order.
_FUSED = {
    "attn.qkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "attn.qkv.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "attn.o.weight": ("self_attn.o_proj.weight",),
    "attn.o.bias": ("self_attn.o_proj.bias",),
    "attn.q_norm": ("self_attn.q_norm.weight",),
    "attn.k_norm": ("self_attn.k_norm.weight",),
    "mlp.gate_up.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.gate_up.bias": ("mlp.gate_proj.bias", "mlp.up_proj.bias"),
    "mlp.down.weight": ("mlp.down_proj.weight",),
    "mlp.down.bias": ("mlp.down_proj.bias",),
    "input_norm": ("input_layernorm.weight",),
    "post_attention_norm": ("post_attention_layernorm.weight",),
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


# A CPU model in a narrower dtype keeps these in float32: the LM head's logits (and the exact greedy
# screen over them) stay fp32 products of the bf16 hidden state, and the embedding is tied to it.
_FP32_ON_CPU = ("embed_tokens", "lm_head.weight")


def param_dtype(name: str, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype parameter `name` is stored in for a model run in `dtype` on `device`."""
    return torch.float32 if device.type == "cpu" and name in _FP32_ON_CPU else dtype


def load_model(model_dir: str | Path, ops, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    """Build the model for model_dir's config and fill every parameter from its safetensors files."""
    model_dir = Path(model_dir)
    cfg = ModelConfig.from_model_dir(model_dir)
    model = LlamaForCausalLM(cfg, ops)
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


def _fill_from_cache(model: LlamaForCausalLM, path: Path, dtype: torch.dtype, device: torch.device) -> bool:
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
    used: set[str] = set()
    for name, param in model.named_parameters():
        sources = _sources(name, cfg)
        missing = [s for s in sources if s not in tensors]
        if missing:
            raise ValueError(f"checkpoint in {model_dir} lacks {missing[0]} (needed for {name})")
        value = (
            torch.cat([tensors[s]() for s in sources], dim=0) if len(sources) > 1 else tensors[sources[0]]()
        )
        if value.shape != param.shape:
            raise ValueError(f"{sources[0]} has shape {tuple(value.shape)}, expected {tuple(param.shape)}")
        param.data = value.to(device=device, dtype=param_dtype(name, dtype, device)).contiguous()
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
    return tuple(f"model.layers.{index}.{s}" for s in _FUSED[local])


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
            loaders[key] = lambda h=handle, k=key: h.get_tensor(k)
    return loaders
