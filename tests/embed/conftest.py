"""Fixtures of the embedding tests: tiny random embedders, built once per session."""

from __future__ import annotations

import pytest
from embed_models import build_encoder


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory):
    return build_encoder("bert", tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_xlmr(tmp_path_factory):
    return build_encoder("xlm-roberta", tmp_path_factory.mktemp("tiny-xlmr"), pooling="cls", normalize=False)
