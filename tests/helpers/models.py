"""Tiny random-weight models the real engine runs in seconds, for the job, CLI, distributed and task
tests: a byte-level tokenizer (every text encodes) with a chat template, and small engine flags."""

from __future__ import annotations

from pathlib import Path

# Small engine settings so a test allocates megabytes, not a free-memory-sized KV cache.
ENGINE_FLAGS = ["--kv-cache-mem", "16MiB", "--max-seqs", "16", "--max-batch-tokens", "512"]

SPECIALS = ["<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer():
    """A byte-level BPE tokenizer with no merges: every text encodes, decoding round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for name in SPECIALS:
        vocab[name] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|end|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_tiny_model(directory: Path, max_positions: int = 512, seed: int = 0) -> Path:
    """Save a random 2-layer Llama (hidden 32) with the byte tokenizer into `directory`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
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
