"""An Engine over the real ModelRunner: the one place the torch-free core meets the torch worker."""

from __future__ import annotations

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.engine import Engine


def load_engine(model_dir: str, config: EngineConfig | None = None) -> Engine:
    """Load the model in the local directory `model_dir` (resolved by the caller) into an Engine."""
    from bulkrun.engine.worker.runner import ModelRunner  # torch lives behind this import

    config = config or EngineConfig()
    return Engine(ModelRunner(str(model_dir), config), config)
