"""bulkrun: offline bulk LLM inference. The Python API (bulkrun/api.py) is imported on first use, so
`import bulkrun` stays light (no torch, no pandas)."""

__version__ = "0.1.0"
__all__ = ["embeddings", "errors", "metrics", "results", "run", "sweep"]

_API = frozenset(__all__)


def __getattr__(name: str):
    if name in _API:
        from bulkrun import api

        return getattr(api, name)
    raise AttributeError(f"module 'bulkrun' has no attribute {name!r}")
