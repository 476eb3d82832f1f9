"""Fixtures for the task tests: the default model's tokenizer, a tiny random model sharing it, and a
reference scorer that computes continuation log-probabilities directly with transformers."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def default_model_dir():
    from bulkrun.model_source import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """A 2-layer random Llama with the default tokenizer's vocabulary (so real prompts work)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    # Random weights give near-uniform distributions; a larger scale makes label scores differ.
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(20)
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
