"""Tiny random-weight models the real engine runs in seconds, the one place tests build them:
- make_tiny_model: a Llama with a byte-level tokenizer (every text encodes) and a chat template, for
  the job, CLI, distributed and task tests (with ENGINE_FLAGS, small engine settings);
- make_model_for_tokenizer: a Llama with a real tokenizer's vocabulary (or build_harmony_tokenizer's:
  gpt-oss's harmony markers as special tokens);
- build_tiny_model(kind): one checkpoint per supported model family (KINDS) with a word tokenizer
  (or, text_tokenizer=True, the byte tokenizer: the task and constrained-decoding tests need text),
  for the model tests that compare with transformers."""

from __future__ import annotations

from pathlib import Path

# Small engine settings so a test allocates megabytes, not a free-memory-sized KV cache.
# float32: outputs are compared token for token with transformers' fp32
ENGINE_FLAGS = ["--dtype", "float32", "--kv-cache-bytes", "16MiB", "--max-num-seqs", "16",
                "--max-num-batched-tokens", "512"]  # fmt: skip

SPECIALS = ["<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


# gpt-oss's harmony format: its markers are special tokens, <|return|> ends the answer
HARMONY_SPECIALS = ["<|start|>", "<|channel|>", "<|constrain|>", "<|message|>", "<|end|>", "<|return|>",
                    "<|call|>", "<|endoftext|>"]  # fmt: skip
HARMONY_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)


def build_tokenizer(specials=SPECIALS, eos="<|end|>", pad="<|end|>", chat_template=CHAT_TEMPLATE):
    """A byte-level BPE tokenizer with no merges: every text encodes, decoding round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for name in specials:
        vocab[name] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=pad)
    fast.chat_template = chat_template
    return fast


def build_harmony_tokenizer():
    """The byte-level tokenizer with gpt-oss's harmony markers and a template that ends in
    `<|start|>assistant`, as gpt-oss's does."""
    return build_tokenizer(HARMONY_SPECIALS, "<|return|>", "<|endoftext|>", HARMONY_TEMPLATE)


def make_tiny_model(directory: Path, max_positions: int = 512, seed: int = 0, **shape) -> Path:
    """Save a random 2-layer Llama (hidden 32; `shape` overrides config fields) with the byte
    tokenizer into `directory`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    settings = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, tie_word_embeddings=False)  # fmt: skip
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_positions,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
        **{**settings, **shape},
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


def make_model_for_tokenizer(directory: Path, tokenizer, *, embed_scale: float = 20.0) -> Path:
    """A 2-layer random Llama (hidden 64) with a real tokenizer's vocabulary, so real prompts work.
    Random weights give near-uniform distributions; a larger embedding scale makes scores differ."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(embed_scale)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


# --- one tiny checkpoint per model family (tests/model) ---------------------------------------------
VOCAB = 96
_COMMON = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
    pad_token_id=0,
)  # fmt: skip
_LLAMA3_ROPE = {
    "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
}  # fmt: skip


def _longrope(n: int, **extra) -> dict:
    """LongRoPE parameters with n short and n long factors, apart enough that a wrong choice shows."""
    return {"rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(n)],
            "long_factor": [2.0 + 0.5 * i for i in range(n)], **extra}  # fmt: skip


KINDS = {
    # kind: (transformers config class, its settings beside _COMMON)
    "llama": ("LlamaConfig", dict(tie_word_embeddings=True, rope_theta=50000.0)),  # SmolLM2-like
    "llama_untied": ("LlamaConfig", dict(tie_word_embeddings=False, head_dim=32)),
    "llama3_rope": ("LlamaConfig", dict(rope_parameters=_LLAMA3_ROPE)),
    "mistral": ("MistralConfig", dict(sliding_window=None, tie_word_embeddings=False)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=False)),  # q/k/v bias
    "qwen3": ("Qwen3Config", dict(head_dim=16, tie_word_embeddings=True)),  # per-head q/k norm
    # sliding layers (window 8: the tests' prompts are longer) beside full ones, soft-capped scores
    # and logits, query_pre_attn_scalar apart from head_dim
    "gemma2": (
        "Gemma2Config",
        dict(
            head_dim=16,
            sliding_window=8,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=4.0,
            final_logit_softcapping=8.0,
        ),
    ),
    # 5 sliding layers per full one, local / global RoPE bases (the global one linearly scaled),
    # q/k norms, head_dim 256
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            num_hidden_layers=6,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=256,
            sliding_window=8,
            query_pre_attn_scalar=64,
            rope_scaling={"rope_type": "linear", "factor": 4.0},
        ),
    ),
    # mixtures of experts: 4 experts, top 2; Qwen3-MoE renormalized, with a dense layer among the sparse
    "qwen3_moe": ("Qwen3MoeConfig", dict(head_dim=16, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1])),
    "qwen2_moe": ("Qwen2MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=48, norm_topk_prob=False)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None)),
    # fused qkv / gate_up as stored; a sliding window on every layer
    "phi3": ("Phi3Config", dict(sliding_window=8, pad_token_id=0, tie_word_embeddings=False)),
    # LongRoPE over a short context of 32 (the tests' prompts fall on both sides of it; generation
    # crosses it), the attention factor derived from max / original positions (Phi-3.5-mini-like)
    "phi3_longrope": ("Phi3Config", dict(pad_token_id=0, original_max_position_embeddings=32,
                                         rope_parameters=_longrope(8))),
    # and partial rotary: 12 of 16 dims rotated, a configured attention factor (Phi-4-mini-like)
    "phi4_mini": ("Phi3Config", dict(pad_token_id=0, original_max_position_embeddings=32, partial_rotary_factor=0.75,
                                     rope_parameters=_longrope(6, attention_factor=1.1))),
    # sinks, alternating sliding (window 8) / full layers, YaRN, attention and expert biases, the
    # clamped SwiGLU (a small limit so it clamps)
    "gpt_oss": ("GptOssConfig", dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                                     swiglu_limit=1.5, tie_word_embeddings=False, layer_types=None,
                                     rope_parameters={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0,
                                                      "beta_slow": 1.0, "truncate": False, "rope_theta": 10000.0,
                                                      "original_max_position_embeddings": 32})),
}  # fmt: skip


def build_tiny_model(
    kind: str, folder: Path, seed: int = 0, text_tokenizer: bool = False, **config_overrides
):
    """Save a tiny `kind` model to folder (config_overrides: e.g. num_hidden_layers); return the
    transformers model (fp32, eval). text_tokenizer: the byte tokenizer with its chat template instead
    of the word one (every text encodes; the grammar engine needs a decoder), the vocabulary and
    special ids sized to it.

    Weights are redrawn larger than transformers' init (std 0.02 makes every logit nearly equal, which
    would let a wrong head order or a missing bias pass unnoticed)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config_class, settings = KINDS[kind]
    tokenizer = build_tokenizer() if text_tokenizer else None
    if tokenizer is not None:
        ids = dict(vocab_size=len(tokenizer), bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        config_overrides = {**ids, **config_overrides}
    config = getattr(transformers, config_class)(**{**_COMMON, **settings, **config_overrides})
    model = transformers.AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager"
    )
    # Gemma's norms multiply by (1 + weight): theirs are drawn around 0 so every norm scales by ~1
    norm_center = 0.0 if config.model_type.startswith("gemma") else 1.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(norm_center + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 1 else p.shape[-1] ** -0.5))
    model.eval()
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    else:
        save_word_tokenizer(folder)
    return model


def save_word_tokenizer(folder: Path) -> None:
    """A whitespace word-level tokenizer: 'w0 w1 ...' <-> ids, specials at 0..2."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, VOCAB)}
    tok = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<pad>"
    )
    fast.save_pretrained(folder)


def hf_greedy(hf, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """transformers' fp32 greedy continuation of each prompt alone, exactly new_tokens long (no EOS)."""
    import torch

    out = []
    for ids in prompts:
        with torch.no_grad():
            seq = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=new_tokens, do_sample=False, eos_token_id=None)  # fmt: skip
        out.append(seq[0, len(ids) :].tolist())
    return out
