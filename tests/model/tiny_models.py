"""Tiny random-weight Llama-family checkpoints (config + safetensors + tokenizer) in a temp folder.

Weights are redrawn larger than transformers' init (std 0.02 makes every logit nearly equal, which
would let a wrong head order or a missing bias pass unnoticed).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

VOCAB = 96
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

KINDS = {
    # SmolLM2-like: GQA, tied embeddings, a non-default rope theta
    "llama": lambda: LlamaConfig(**_COMMON, tie_word_embeddings=True, rope_theta=50000.0),
    "llama_untied": lambda: LlamaConfig(**_COMMON, tie_word_embeddings=False, head_dim=32),
    "llama3_rope": lambda: LlamaConfig(
        **_COMMON,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "mistral": lambda: MistralConfig(**_COMMON, sliding_window=None, tie_word_embeddings=False),
    "qwen2": lambda: Qwen2Config(**_COMMON, tie_word_embeddings=False),  # q/k/v bias
    "qwen3": lambda: Qwen3Config(**_COMMON, head_dim=16, tie_word_embeddings=True),  # per-head q/k norm
}


def build_tiny_model(kind: str, folder: Path, seed: int = 0):
    """Save a tiny `kind` model to folder; return the transformers model (fp32, eval)."""
    torch.manual_seed(seed)
    config = KINDS[kind]()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 1 else p.shape[-1] ** -0.5))
    model.eval()
    model.save_pretrained(folder)
    save_word_tokenizer(folder)
    return model


def save_word_tokenizer(folder: Path) -> None:
    """A whitespace word-level tokenizer: 'w0 w1 ...' <-> ids, specials at 0..2."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, VOCAB)}
    tok = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<pad>"
    )
    fast.save_pretrained(folder)
