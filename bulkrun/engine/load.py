"""Engines over real runners: the one place the torch-free core meets the torch worker.

A BERT-family directory gets the EncoderEngine (whole prompts, pooled); every other model the Engine
(paged KV cache, continuous batching), whose pooling requests serve decoder embedders. Either engine
carries the directory's sentence-transformers profile (pooling, normalize, max length, prompts).
"""

from __future__ import annotations

from dataclasses import replace

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.encoder_engine import EncoderEngine
from bulkrun.engine.core.engine import Engine


def load_engine(model_dir: str, config: EngineConfig | None = None) -> Engine | EncoderEngine:
    """Load the model in the local directory `model_dir` (resolved by the caller) into an engine."""
    from bulkrun.model.encoder_config import is_encoder_dir  # torch lives behind these imports
    from bulkrun.model.sentence_transformers_config import read_embedding_profile

    config = config or EngineConfig()
    profile = read_embedding_profile(model_dir)
    if is_encoder_dir(model_dir):
        from bulkrun.engine.worker.encoder_runner import EncoderRunner

        engine = EncoderEngine(EncoderRunner(str(model_dir), config), config)
    else:
        from bulkrun.engine.worker.runner import ModelRunner

        engine = Engine(ModelRunner(str(model_dir), config), config)
        profile = replace(profile, pooling_methods=("last",))  # earlier rows are gone once computed
    engine.embedding_profile = profile
    return engine
