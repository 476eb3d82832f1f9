"""Load a BERT-family checkpoint (transformers' BertModel / RobertaModel / XLMRobertaModel weights,
with or without the `bert.` / `roberta.` prefix a task head adds) into our fused-QKV encoder.

The word, position and token-type embeddings and every LayerNorm stay fp32 (the residual stream is
fp32); the linears take the run's dtype. Weights of heads an embedding does not use (the pooler, an
MLM head) are skipped; anything else unexpected, or anything missing, is refused.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bulkrun.model.bert import BertEncoder, VarlenAttention
from bulkrun.model.encoder_config import EncoderConfig
from bulkrun.model.loader import _open_checkpoint

_PREFIXES = ("bert.", "roberta.", "model.")
_EMBEDDINGS = {
    "word_embeddings": "embeddings.word_embeddings.weight",
    "position_embeddings": "embeddings.position_embeddings.weight",
    "token_type_embeddings": "embeddings.token_type_embeddings.weight",
    "embedding_norm.weight": "embeddings.LayerNorm.weight",
    "embedding_norm.bias": "embeddings.LayerNorm.bias",
}
# our per-layer parameter <- transformers' (concatenated along dim 0 in this order)
_LAYER = {
    "qkv.weight": ("attention.self.query.weight", "attention.self.key.weight", "attention.self.value.weight"),
    "qkv.bias": ("attention.self.query.bias", "attention.self.key.bias", "attention.self.value.bias"),
    "o.weight": ("attention.output.dense.weight",),
    "o.bias": ("attention.output.dense.bias",),
    "attention_norm.weight": ("attention.output.LayerNorm.weight",),
    "attention_norm.bias": ("attention.output.LayerNorm.bias",),
    "up.weight": ("intermediate.dense.weight",),
    "up.bias": ("intermediate.dense.bias",),
    "down.weight": ("output.dense.weight",),
    "down.bias": ("output.dense.bias",),
    "output_norm.weight": ("output.LayerNorm.weight",),
    "output_norm.bias": ("output.LayerNorm.bias",),
}
_UNUSED = ("pooler.", "cls.", "lm_head.", "embeddings.position_ids")


def load_encoder(model_dir: str | Path, attention: VarlenAttention, dtype: torch.dtype,
                 device: torch.device) -> BertEncoder:  # fmt: skip
    model_dir = Path(model_dir)
    cfg = EncoderConfig.from_model_dir(model_dir)
    model = BertEncoder(cfg, attention)
    tensors = {_strip(name): load for name, load in _open_checkpoint(model_dir).items()}
    used: set[str] = set()
    for name, param in model.named_parameters():
        sources = _sources(name)
        missing = [s for s in sources if s not in tensors]
        if missing:
            raise ValueError(f"checkpoint in {model_dir} lacks {missing[0]} (needed for {name})")
        value = torch.cat([tensors[s]() for s in sources], dim=0)
        if value.shape != param.shape:
            raise ValueError(f"{sources[0]} has shape {tuple(value.shape)}, expected {tuple(param.shape)}")
        linear = name.split(".")[-2] in ("qkv", "o", "up", "down") if name.startswith("layers.") else False
        param.data = value.to(device=device, dtype=dtype if linear else torch.float32).contiguous()
        used.update(sources)
    unexpected = [n for n in tensors if n not in used and not n.startswith(_UNUSED)]
    if unexpected:
        raise ValueError(f"checkpoint in {model_dir} has weights this encoder does not use: {unexpected[:5]}")
    return model.eval()


def _strip(name: str) -> str:
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _sources(name: str) -> tuple[str, ...]:
    if name in _EMBEDDINGS:
        return (_EMBEDDINGS[name],)
    _, index, local = name.split(".", 2)  # layers.{i}.{local}
    return tuple(f"encoder.layer.{index}.{s}" for s in _LAYER[local])
