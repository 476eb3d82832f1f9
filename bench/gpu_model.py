"""The GPU bench's model and workload: a random-weight Llama (or another family's shape) saved with a
local tokenizer, random prompts.

Nothing comes from a hub: the config is written here, weights are random, and the tokenizer is a
word-level one over made-up words so that every token id decodes.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = True  # lm_head shares the embedding


LLAMA_3_2_1B = Shape(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256)
LLAMA_3_1_8B = Shape(
    hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256, tied=False
)
# The engine checks' model: few layers (quick to build and judge) with 8B-like heads (head_dim 128,
# GQA 8) and the real vocabulary (its logits matter to memory sizing).
CHECK = Shape(hidden=2048, layers=4, heads=16, kv_heads=2, intermediate=5632, vocab=128256)
TINY = Shape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512)
SHAPES = {"1b": LLAMA_3_2_1B, "8b": LLAMA_3_1_8B, "check": CHECK, "tiny": TINY}


def build_tokenizer(vocab_size: int):
    """A word-level tokenizer over `vocab_size` made-up words, so every id decodes (ids 0-2 special)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size)}
    vocab.update({"<unk>": 0, "<s>": 1, "</s>": 2})
    for i in range(3):
        vocab.pop(f"w{i}")
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def build_model_dir(shape: Shape, dtype, device: str, path: Path, max_positions: int):
    """Random-weight Llama saved (safetensors + tokenizer) into `path`; returns its config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.intermediate,
        vocab_size=shape.vocab,
        max_position_embeddings=max_positions,
        rope_theta=500000.0,
        tie_word_embeddings=shape.tied,
        bos_token_id=1,
        eos_token_id=2,
    )
    save_random(LlamaForCausalLM, config, dtype, device, path)
    return config


def save_random(model_class, config, dtype, device: str, path: Path) -> None:
    """A random-weight `model_class(config)` saved (safetensors + word tokenizer) into `path`."""
    import torch

    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in its dtype: an 8B model never exists in fp32 (32 GB)
    try:
        with torch.device(device):  # initialising on the GPU takes seconds, on the CPU minutes
            model = model_class(config)
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(path)
    build_tokenizer(config.vocab_size).save_pretrained(path)
    del model


# gpu_check's family stages: (transformers config class, fields). Only fields every supported
# transformers version takes; their defaults give the rest (Gemma 3's local / global RoPE bases, its
# pattern of five sliding layers per global one). Fewer layers than the real models: every layer
# kind is there, and the stage fits its minutes.
FAMILY_SHAPES = {
    # Gemma-3-1B's layers: head_dim 256, 4 query heads on 1 kv head, window 512, GeGLU, q/k norms
    "gemma3": ("Gemma3TextConfig", dict(
        hidden_size=1152, intermediate_size=6912, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, sliding_window=512, query_pre_attn_scalar=256,
        vocab_size=262144, tie_word_embeddings=True)),
    "gemma3-tiny": ("Gemma3TextConfig", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=2,
        num_key_value_heads=1, head_dim=256, sliding_window=8, query_pre_attn_scalar=64, vocab_size=512)),
    # Qwen3-30B-A3B's layers: 128 experts of 768, top 8 renormalized, 32 / 4 heads of 128, q/k norms
    "qwen3_moe": ("Qwen3MoeConfig", dict(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        moe_intermediate_size=768, norm_topk_prob=True, vocab_size=151936, tie_word_embeddings=False)),
    "qwen3_moe-tiny": ("Qwen3MoeConfig", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        norm_topk_prob=True, vocab_size=512, tie_word_embeddings=False)),
}  # fmt: skip


def build_family_dir(name: str, dtype, device: str, path: Path, max_positions: int):
    """Random-weight model of FAMILY_SHAPES[name] saved (safetensors + tokenizer) into `path`; returns
    its config."""
    import transformers

    class_name, fields = FAMILY_SHAPES[name]
    config = getattr(transformers, class_name)(
        **fields, max_position_embeddings=max_positions, bos_token_id=1, eos_token_id=2, pad_token_id=0
    )
    save_random(transformers.AutoModelForCausalLM.from_config, config, dtype, device, path)
    return config


def hf_dtype(dtype) -> dict:
    """from_pretrained's dtype keyword: `dtype=` from transformers 4.56, `torch_dtype=` before (the
    environment stage finds which and sets GPU_CHECK_HF_DTYPE_KW)."""
    return {os.environ.get("GPU_CHECK_HF_DTYPE_KW", "dtype"): dtype}


def make_prompts(n: int, lo: int, hi: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [lo + (hi - lo) * i // max(1, n - 1) for i in range(n)]
    rng.shuffle(lengths)  # arrival order is not sorted by length
    return [[rng.randrange(3, vocab) for _ in range(length)] for length in lengths]
