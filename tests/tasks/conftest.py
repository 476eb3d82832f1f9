"""Fixtures for the task tests: the default model's tokenizer, a tiny random model sharing it, and a
reference scorer that computes continuation log-probabilities directly with transformers."""

from __future__ import annotations

import pytest
from helpers.models import make_model_for_tokenizer


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
    return make_model_for_tokenizer(tmp_path_factory.mktemp("tiny-llama"), tokenizer)
