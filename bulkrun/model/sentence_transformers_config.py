"""How a sentence-transformers directory says its vectors are made, read as sentence-transformers reads it.

modules.json lists the pipeline: a Transformer (the model itself), a Pooling module whose config.json
names the pooling mode, optionally a Normalize module; sentence_bert_config.json gives the longest
text in tokens (max_seq_length); config_sentence_transformers.json the named prompts ("query: " ...)
and which one applies by default. A plain Hugging Face directory has none of these: its profile
says nothing and the job's --pooling / --normalize decide. Modules we cannot reproduce (Dense
projections, max pooling) are refused with their name rather than silently skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from bulkrun.model.config import UnsupportedModelError

POOLING_METHODS = ("mean", "cls", "last")
_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}
_UNSUPPORTED_MODES = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
)
_KNOWN_MODULES = ("Transformer", "Pooling", "Normalize")


@dataclass(frozen=True, slots=True)
class EmbeddingProfile:
    """What the model directory fixes about its embeddings (None: the directory does not say)."""

    pooling: str | None = None
    normalize: bool | None = None
    max_length: int | None = None  # tokens, special tokens included
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    # what the engine this model runs on can pool (a decoder keeps only its last row): set by the loader
    pooling_methods: tuple[str, ...] = POOLING_METHODS


def read_embedding_profile(model_dir: str | Path) -> EmbeddingProfile:
    model_dir = Path(model_dir)
    modules_path = model_dir / "modules.json"
    if not modules_path.is_file():
        return EmbeddingProfile()
    pooling, normalize = None, False
    for module in json.loads(modules_path.read_text()):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in _KNOWN_MODULES:
            raise UnsupportedModelError(
                f"{modules_path}: module {module.get('type')!r} is not supported (only {', '.join(_KNOWN_MODULES)})"
            )
        if kind == "Transformer" and module.get("path", "") not in ("", "."):
            raise UnsupportedModelError(
                f"{modules_path}: the transformer lives in '{module['path']}'; give that folder as the model"
            )
        if kind == "Pooling":
            pooling = _pooling_mode(model_dir / module.get("path", "") / "config.json")
        normalize = normalize or kind == "Normalize"
    st_config = _read_json(model_dir / "config_sentence_transformers.json")
    bert_config = _read_json(model_dir / "sentence_bert_config.json")
    return EmbeddingProfile(
        pooling=pooling,
        normalize=normalize,
        max_length=bert_config.get("max_seq_length"),
        prompts=dict(st_config.get("prompts") or {}),
        default_prompt_name=st_config.get("default_prompt_name"),
    )


def _pooling_mode(path: Path) -> str:
    config = _read_json(path)
    if not config:
        raise UnsupportedModelError(f"{path}: the pooling module has no config")
    for key in _UNSUPPORTED_MODES:
        if config.get(key):
            raise UnsupportedModelError(f"{path}: {key} is not supported (mean, cls or last-token pooling)")
    if config.get("include_prompt") is False:
        raise UnsupportedModelError(f"{path}: pooling that leaves the prompt out is not supported")
    chosen = [mode for key, mode in _MODES.items() if config.get(key)]
    if len(chosen) != 1:
        raise UnsupportedModelError(f"{path}: expected exactly one pooling mode, found {chosen or 'none'}")
    return chosen[0]


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
